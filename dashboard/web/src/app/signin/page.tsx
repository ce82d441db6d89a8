"use client";

import { Suspense, useState, type FormEvent } from "react";
import { useRouter, useSearchParams } from "next/navigation";
import { apiBase, call, type Session } from "@/lib/api";
import { useSession } from "@/lib/session";

const errors: Record<string, string> = {
  domain_not_allowed: "That Google account's domain may not sign in here.",
  provider_refused: "Sign-in was cancelled at Google.",
  flow_expired: "The sign-in took too long; try again.",
  email_unverified: "That Google account's email is not verified.",
};

export default function SignInPage() {
  return (
    <Suspense>
      <SignIn />
    </Suspense>
  );
}

// Only paths inside the app, so a crafted link cannot send people away.
function safeNext(next: string | null): string {
  return next && next.startsWith("/") && !next.startsWith("//") ? next : "/";
}

function SignIn() {
  const { session, reload } = useSession();
  const params = useSearchParams();
  const router = useRouter();
  const next = safeNext(params.get("next"));
  const [problem, setProblem] = useState("");
  const code = params.get("error");

  const devSignIn = async (e: FormEvent) => {
    e.preventDefault();
    setProblem("");
    const email = String(new FormData(e.currentTarget as HTMLFormElement).get("email") ?? "");
    try {
      // The pre-sign-in CSRF token is bound to a cookie set by /api/session.
      const s = (await reload()) ?? (await call<Session>("GET", "/api/session"));
      await call("POST", "/api/auth/dev", { body: { email }, csrf: s.csrfToken });
      await reload();
      router.replace(next);
    } catch (err) {
      setProblem((err as Error).message);
    }
  };

  return (
    <div className="signin">
      <h1>Sign in to levers9</h1>
      {code && <div className="problem">{errors[code] ?? `Sign-in failed (${code}).`}</div>}
      {session?.signedIn && (
        <p>
          Signed in as <b>{session.email}</b>. <a href={next}>Continue</a>
        </p>
      )}
      {session?.googleSignIn && (
        <a className="button primary" href={`${apiBase}/api/auth/google/start?next=${encodeURIComponent(next)}`}>
          Sign in with Google
        </a>
      )}
      {session?.devSignIn && (
        <form onSubmit={devSignIn} className="card" data-testid="dev-signin">
          <h2>Development sign-in</h2>
          <p className="muted">Any email signs in, no password. Emails the API lists as admins get the admin role.</p>
          <label>
            Email
            <input type="email" name="email" defaultValue="you@localhost" required />
          </label>
          <button type="submit" className="primary">
            Sign in
          </button>
        </form>
      )}
      {session && !session.devSignIn && !session.googleSignIn && (
        <p className="problem">No sign-in method is configured on the dashboard API.</p>
      )}
      {problem && <div className="problem">{problem}</div>}
    </div>
  );
}
