import { maxBodyBytes, parseReports, RateLimiter, readBounded } from "@/lib/cspreport";

// One limiter for the server process: reports are a signal, not a log to
// keep whole; a flood (a broken page in many tabs, or someone posting on
// purpose) costs at most 30 lines at once, then 60 a minute.
const limiter = new RateLimiter(30, 60);

export const dynamic = "force-dynamic";

export async function POST(req: Request): Promise<Response> {
  if (!limiter.allow()) {
    return new Response(null, { status: 429 });
  }
  const body = await readBounded(req, maxBodyBytes);
  if (body === null) {
    return new Response(null, { status: 413 });
  }
  for (const line of parseReports(body)) {
    console.log(JSON.stringify(line));
  }
  return new Response(null, { status: 204 });
}
