"use client";

import Link from "next/link";
import { usePathname } from "next/navigation";
import type { ReactNode } from "react";
import { call } from "@/lib/api";
import { SessionProvider, useSession } from "@/lib/session";

const nav = [
  { href: "/", label: "Overview" },
  { href: "/tasks", label: "Tasks" },
  { href: "/machines", label: "Machines" },
  { href: "/tokens", label: "Tokens" },
  { href: "/secrets", label: "Secrets" },
  { href: "/security", label: "Security" },
];

export function Shell({ children }: { children: ReactNode }) {
  return (
    <SessionProvider>
      <DevBanner />
      <header className="topbar">
        <Link href="/" className="brand">
          levers9
        </Link>
        <Nav />
        <UserMenu />
      </header>
      <main className="content">{children}</main>
    </SessionProvider>
  );
}

function DevBanner() {
  const { session } = useSession();
  if (!session?.devSignIn) return null;
  return (
    <div className="devbanner" role="alert" data-testid="dev-banner">
      Development sign-in is on: anyone can sign in with any email, no password. Never run it like this in production
      (unset <code>LEVERS9_DASHBOARD_DEV_SIGNIN</code>).
    </div>
  );
}

function Nav() {
  const path = usePathname();
  return (
    <nav className="nav">
      {nav.map((n) => {
        const active = n.href === "/" ? path === "/" : path.startsWith(n.href);
        return (
          <Link key={n.href} href={n.href} className={active ? "active" : undefined}>
            {n.label}
          </Link>
        );
      })}
    </nav>
  );
}

function UserMenu() {
  const { session, reload } = useSession();
  if (!session?.signedIn) return <div className="user" />;
  const signOut = async () => {
    try {
      await call("POST", "/api/auth/signout", { csrf: session.csrfToken });
    } finally {
      await reload();
    }
  };
  return (
    <div className="user">
      <span className="email" data-testid="user-email">
        {session.email}
      </span>
      <span className={`role role-${session.role}`}>{session.role}</span>
      <button className="link" onClick={signOut}>
        Sign out
      </button>
    </div>
  );
}
