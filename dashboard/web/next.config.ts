import type { NextConfig } from "next";
import { apiOrigins, staticHeaders } from "./src/lib/csp";

// NEXT_PUBLIC_API_BASE is read at build time: the pages call that API, and
// the policies name it. LEVERS9_WEB_DIST_DIR lets the builder keep one build
// per API base side by side (packaging/dev and the browser test set it).
// LEVERS9_WEB_STANDALONE=1 (the dashboard-web image) adds output:
// "standalone": a server.js with only the node_modules it traces, so the
// image carries no npm tree; make up and the tests use next start, which
// that output does not support.
const api = apiOrigins(process.env.NEXT_PUBLIC_API_BASE);

const config: NextConfig = {
  distDir: process.env.LEVERS9_WEB_DIST_DIR || ".next",
  output: process.env.LEVERS9_WEB_STANDALONE === "1" ? "standalone" : undefined,
  poweredByHeader: false,
  reactStrictMode: true,
  // Route types come from next-env.d.ts instead of tsconfig.json's
  // include, which Next.js would otherwise rewrite for each distDir.
  experimental: { strictRouteTypes: true },
  async headers() {
    return [{ source: "/:path*", headers: staticHeaders(api) }];
  },
};

export default config;
