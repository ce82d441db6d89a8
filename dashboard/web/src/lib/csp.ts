// Security headers and the content security policy of the dashboard's web
// app. One place decides them: next.config.ts sends the static headers and
// the enforced policy on every route; src/proxy.ts adds the full policy,
// report-only, with a fresh nonce on every page.
//
// Rollout: the enforced policy only holds what cannot break the app (no
// plugins, no foreign <base>, no framing, forms only to the app or the
// API). Everything else runs report-only and reports to /csp-report until
// its reports are quiet; then move it into enforcedPolicy.

/** Where the browser's violation reports go (src/app/csp-report/route.ts). */
export const reportPath = "/csp-report";

/** The API's origins for connect-src and form-action. */
export interface ApiOrigins {
  /** http(s)://host[:port] of the API, or "" when the API shares the app's origin. */
  http: string;
  /** ws(s)://host[:port] of the API's WebSockets, or "" as above. */
  ws: string;
}

/**
 * apiOrigins turns NEXT_PUBLIC_API_BASE into the origins a policy names:
 * https/wss for an API elsewhere, http/ws only for a local one (localhost
 * or a loopback address); a plain-http API anywhere else is refused.
 */
export function apiOrigins(apiBase: string | undefined): ApiOrigins {
  const base = (apiBase ?? "").trim();
  if (base === "") return { http: "", ws: "" };
  let u: URL;
  try {
    u = new URL(base);
  } catch {
    throw new Error(`NEXT_PUBLIC_API_BASE ${JSON.stringify(base)} is not a URL`);
  }
  if (u.protocol === "https:") return { http: `https://${u.host}`, ws: `wss://${u.host}` };
  if (u.protocol === "http:" && isLocalHost(u.hostname)) {
    return { http: `http://${u.host}`, ws: `ws://${u.host}` };
  }
  throw new Error(
    `NEXT_PUBLIC_API_BASE ${JSON.stringify(base)} must be https (plain http only for localhost or a loopback address)`,
  );
}

function isLocalHost(host: string): boolean {
  const h = host.replace(/^\[|\]$/g, "");
  return h === "localhost" || h.endsWith(".localhost") || /^127\./.test(h) || h === "::1";
}

function join(directives: Array<[string, ...string[]]>): string {
  return directives.map((d) => d.filter((s) => s !== "").join(" ")).join("; ");
}

/** enforcedPolicy is the policy browsers enforce today. */
export function enforcedPolicy(api: ApiOrigins): string {
  return join([
    ["object-src", "'none'"],
    ["base-uri", "'self'"],
    ["frame-ancestors", "'none'"],
    ["form-action", "'self'", api.http],
  ]);
}

/**
 * reportOnlyPolicy is the full policy, sent as
 * Content-Security-Policy-Report-Only: scripts only from the app with this
 * request's nonce, connections only to the app and the API.
 */
export function reportOnlyPolicy(api: ApiOrigins, nonce: string): string {
  return join([
    ["default-src", "'self'"],
    ["script-src", "'self'", `'nonce-${nonce}'`],
    ["style-src", "'self'", `'nonce-${nonce}'`],
    ["img-src", "'self'", "data:"],
    ["font-src", "'self'"],
    ["connect-src", "'self'", api.http, api.ws],
    ["object-src", "'none'"],
    ["base-uri", "'self'"],
    ["frame-ancestors", "'none'"],
    ["form-action", "'self'", api.http],
    ["report-uri", reportPath],
  ]);
}

/** staticHeaders go on every response, pages, assets and route handlers alike. */
export function staticHeaders(api: ApiOrigins): Array<{ key: string; value: string }> {
  return [
    { key: "X-Content-Type-Options", value: "nosniff" },
    { key: "Referrer-Policy", value: "strict-origin-when-cross-origin" },
    { key: "X-Frame-Options", value: "DENY" },
    { key: "Content-Security-Policy", value: enforcedPolicy(api) },
  ];
}

/** newNonce returns 128 random bits, base64: unguessable per response. */
export function newNonce(): string {
  const b = new Uint8Array(16);
  crypto.getRandomValues(b);
  return btoa(String.fromCharCode(...b));
}
