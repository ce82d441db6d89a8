"use client";

// The signed-in user for every page: loaded once from /api/session, shared
// through a context, and refreshed after sign-in and sign-out. A page that
// needs a session sends an anonymous visitor to /signin.

import { createContext, useCallback, useContext, useEffect, useState, type ReactNode } from "react";
import { usePathname, useRouter } from "next/navigation";
import { call, type Session } from "./api";

interface SessionState {
  session: Session | null;
  error: string;
  reload: () => Promise<Session | null>;
}

const SessionContext = createContext<SessionState>({ session: null, error: "", reload: async () => null });

export function SessionProvider({ children }: { children: ReactNode }) {
  const [session, setSession] = useState<Session | null>(null);
  const [error, setError] = useState("");
  const reload = useCallback(async () => {
    try {
      const s = await call<Session>("GET", "/api/session");
      setSession(s);
      setError("");
      return s;
    } catch (e) {
      setError((e as Error).message);
      return null;
    }
  }, []);
  useEffect(() => {
    void reload();
  }, [reload]);
  return <SessionContext.Provider value={{ session, error, reload }}>{children}</SessionContext.Provider>;
}

export function useSession(): SessionState {
  return useContext(SessionContext);
}

/** useSignedIn returns the session once signed in, sending others to /signin. */
export function useSignedIn(): Session | null {
  const { session } = useSession();
  const router = useRouter();
  const path = usePathname();
  useEffect(() => {
    if (session && !session.signedIn) {
      router.replace(`/signin?next=${encodeURIComponent(path)}`);
    }
  }, [session, router, path]);
  return session?.signedIn ? session : null;
}
