import { NextResponse, type NextRequest } from "next/server";
import { apiOrigins, newNonce, reportOnlyPolicy } from "@/lib/csp";

const api = apiOrigins(process.env.NEXT_PUBLIC_API_BASE);

// proxy gives every page a fresh nonce and the full policy, report-only.
// Next.js reads the nonce from the request's policy header and puts it on
// the scripts it renders; the browser gets the same policy on the response.
export function proxy(request: NextRequest) {
  const nonce = newNonce();
  const policy = reportOnlyPolicy(api, nonce);
  const headers = new Headers(request.headers);
  headers.set("content-security-policy-report-only", policy);
  const response = NextResponse.next({ request: { headers } });
  response.headers.set("Content-Security-Policy-Report-Only", policy);
  return response;
}

export const config = {
  // Pages only: static assets and the report endpoint need no nonce.
  matcher: ["/((?!_next/static|_next/image|favicon.ico|csp-report).*)"],
};
