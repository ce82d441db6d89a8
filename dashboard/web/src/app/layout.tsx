import type { Metadata } from "next";
import { connection } from "next/server";
import type { ReactNode } from "react";
import { Shell } from "@/components/shell";
import "./globals.css";

export const metadata: Metadata = {
  title: "levers9 dashboard",
  description: "Tasks, machines and their hardening",
};

export default async function RootLayout({ children }: { children: ReactNode }) {
  // Every page renders per request, so each gets its own CSP nonce
  // (src/proxy.ts); the pages fetch their data in the browser anyway.
  await connection();
  return (
    <html lang="en">
      <body>
        <Shell>{children}</Shell>
      </body>
    </html>
  );
}
