"use client";

import type { ReactNode } from "react";
import { ApiError } from "@/lib/api";
import type { LiveStatus } from "@/lib/ws";

export function Badge({ state }: { state: string }) {
  return (
    <span className={`badge badge-${state}`} data-state={state}>
      {state.replace("_", " ")}
    </span>
  );
}

export function PageHead({ title, children }: { title: string; children?: ReactNode }) {
  return (
    <div className="pagehead">
      <h1>{title}</h1>
      <div className="actions">{children}</div>
    </div>
  );
}

/** Empty says what there is to do when a list has nothing yet. */
export function Empty({ title, children }: { title: string; children?: ReactNode }) {
  return (
    <div className="empty" data-testid="empty">
      <p className="empty-title">{title}</p>
      {children}
    </div>
  );
}

export function Cmd({ children }: { children: ReactNode }) {
  return <pre className="cmd">{children}</pre>;
}

export function Problem({ error }: { error: unknown }) {
  if (!error) return null;
  if (error instanceof ApiError && error.code === "permission_denied") {
    return (
      <div className="problem">
        This view needs the <b>admin</b> role. Ask an admin to add your email to <code>LEVERS9_DASHBOARD_ADMINS</code>.
      </div>
    );
  }
  return (
    <div className="problem" role="alert">
      {(error as Error).message}
    </div>
  );
}

export function Live({ status }: { status: LiveStatus }) {
  const text = { connecting: "connecting", live: "live", reconnecting: "reconnecting…", closed: "finished" }[status];
  return (
    <span className={`live live-${status}`} data-testid="live">
      {text}
    </span>
  );
}

export function KV({ rows }: { rows: Array<[string, ReactNode]> }) {
  return (
    <dl className="kv">
      {rows.map(([k, v]) => (
        <div key={k}>
          <dt>{k}</dt>
          <dd>{v === undefined || v === null || v === "" ? "—" : v}</dd>
        </div>
      ))}
    </dl>
  );
}
