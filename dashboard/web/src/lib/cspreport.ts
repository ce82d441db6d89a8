// Receiving the browsers' CSP violation reports: bounded, rate-limited,
// reduced to a few fields and written as one JSON line each ("csp-report")
// to the web server's log, where an operator reads what the report-only
// policy would break before enforcing it.

/** The largest report body read; larger ones are refused (413). */
export const maxBodyBytes = 16 * 1024;
/** Longest value kept per field. */
const maxField = 300;

/** RateLimiter is a token bucket: burst reports at once, then perMinute. */
export class RateLimiter {
  private tokens: number;
  private last: number;

  constructor(
    private readonly burst: number,
    private readonly perMinute: number,
    private readonly now: () => number = Date.now,
  ) {
    this.tokens = burst;
    this.last = now();
  }

  allow(): boolean {
    const t = this.now();
    this.tokens = Math.min(this.burst, this.tokens + ((t - this.last) / 60000) * this.perMinute);
    this.last = t;
    if (this.tokens < 1) return false;
    this.tokens -= 1;
    return true;
  }
}

export interface CspReportLine {
  msg: "csp-report";
  time: string;
  documentUri: string;
  violatedDirective: string;
  effectiveDirective: string;
  blockedUri: string;
  sourceFile: string;
  lineNumber: number;
  disposition: string;
  sample: string;
}

// URLs lose their query and fragment: they may hold tokens or emails.
function url(v: unknown): string {
  if (typeof v !== "string") return "";
  const cut = v.search(/[?#]/);
  return str(cut >= 0 ? v.slice(0, cut) : v);
}

function str(v: unknown): string {
  return typeof v === "string" ? v.slice(0, maxField) : "";
}

/**
 * parseReports reads both report formats: report-uri's
 * {"csp-report": {...}} and the Reporting API's [{type: "csp-violation",
 * body: {...}}]. Anything else yields no lines.
 */
export function parseReports(body: string, now: Date = new Date()): CspReportLine[] {
  let doc: unknown;
  try {
    doc = JSON.parse(body);
  } catch {
    return [];
  }
  const out: CspReportLine[] = [];
  const time = now.toISOString();
  const items = Array.isArray(doc) ? doc : [doc];
  for (const item of items.slice(0, 10)) {
    if (typeof item !== "object" || item === null) continue;
    const o = item as Record<string, unknown>;
    const legacy = o["csp-report"] as Record<string, unknown> | undefined;
    if (legacy && typeof legacy === "object") {
      out.push({
        msg: "csp-report",
        time,
        documentUri: url(legacy["document-uri"]),
        violatedDirective: str(legacy["violated-directive"]),
        effectiveDirective: str(legacy["effective-directive"]),
        blockedUri: url(legacy["blocked-uri"]),
        sourceFile: url(legacy["source-file"]),
        lineNumber: Number(legacy["line-number"]) || 0,
        disposition: str(legacy["disposition"]),
        sample: str(legacy["script-sample"]),
      });
      continue;
    }
    const b = o["body"] as Record<string, unknown> | undefined;
    if (o["type"] === "csp-violation" && b && typeof b === "object") {
      out.push({
        msg: "csp-report",
        time,
        documentUri: url(b["documentURL"]),
        violatedDirective: str(b["effectiveDirective"]),
        effectiveDirective: str(b["effectiveDirective"]),
        blockedUri: url(b["blockedURL"]),
        sourceFile: url(b["sourceFile"]),
        lineNumber: Number(b["lineNumber"]) || 0,
        disposition: str(b["disposition"]),
        sample: str(b["sample"]),
      });
    }
  }
  return out;
}

/** readBounded reads at most limit bytes of a request body, or null when it is longer. */
export async function readBounded(req: Request, limit: number): Promise<string | null> {
  const declared = Number(req.headers.get("content-length") ?? "0");
  if (declared > limit) return null;
  if (!req.body) return "";
  const reader = req.body.getReader();
  const chunks: Uint8Array[] = [];
  let size = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    size += value.byteLength;
    if (size > limit) {
      await reader.cancel();
      return null;
    }
    chunks.push(value);
  }
  const all = new Uint8Array(size);
  let off = 0;
  for (const c of chunks) {
    all.set(c, off);
    off += c.byteLength;
  }
  return new TextDecoder().decode(all);
}
