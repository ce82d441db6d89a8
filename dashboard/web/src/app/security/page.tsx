"use client";

import Link from "next/link";
import { useEffect, useState } from "react";
import { call, type Pool, type SecurityReport } from "@/lib/api";
import { when } from "@/lib/format";
import { useSignedIn } from "@/lib/session";
import { Cmd, Empty, PageHead, Problem } from "@/components/ui";

export default function SecurityPage() {
  const session = useSignedIn();
  const [pools, setPools] = useState<Pool[] | null>(null);
  const [reports, setReports] = useState<Record<string, SecurityReport | Error>>({});
  const [error, setError] = useState<unknown>(null);
  useEffect(() => {
    if (!session) return;
    call<{ pools: Pool[] }>("GET", "/api/pools").then((r) => {
      setPools(r.pools);
      for (const p of r.pools) {
        call<SecurityReport>("GET", `/api/security?pool=${encodeURIComponent(p.name)}`).then(
          (rep) => setReports((old) => ({ ...old, [p.name]: rep })),
          (e) => {
            setReports((old) => ({ ...old, [p.name]: e }));
            setError(e);
          },
        );
      }
    }, setError);
  }, [session]);
  if (!session) return null;
  return (
    <>
      <PageHead title="Security" />
      <p className="muted">
        Per pool: what the egress chains refused (or, in observe mode, would refuse), what seccomp&apos;s log mode recorded, and whether
        enforcing is safe. The same as <code>levers9 security report --pool NAME</code>.
      </p>
      <Problem error={error} />
      {pools && pools.length === 0 && (
        <Empty title="No pools yet">
          <Cmd>levers9 machine create --pool default</Cmd>
        </Empty>
      )}
      {pools?.map((p) => {
        const r = reports[p.name];
        return (
          <section key={p.name} className="card" data-pool={p.name} data-testid="security-pool">
            <h2>Pool {p.name}</h2>
            {!r && <p className="muted">Loading…</p>}
            {r instanceof Error && <p className="muted">No report: {r.message}</p>}
            {r && !(r instanceof Error) && <PoolReport pool={p.name} rep={r} />}
          </section>
        );
      })}
    </>
  );
}

function PoolReport({ pool, rep }: { pool: string; rep: SecurityReport }) {
  const eg = rep.report;
  const sc = rep.seccomp;
  const max = Math.max(1, ...eg.byClass.map((c) => Number(c.count)));
  return (
    <div className="grid2">
      <div>
        <h3>
          Egress <span className="pill">{eg.mode || "unknown"}</span>
        </h3>
        <Advice
          safe={eg.safeToEnforce}
          enforced={eg.mode === "enforce"}
          what={`worker.pools.${pool}.security.egress.mode: enforce`}
          notYet={
            eg.machinesReporting === 0
              ? "No machine of this pool has reported yet: wait for one to run tasks."
              : eg.machinesBlind.length > 0
                ? `Some machines cannot see their containers' traffic: ${eg.machinesBlind.join("; ")}.`
                : `${eg.total} connection attempt(s) would be refused. Add the ones tasks need to egress.allow, or confirm tasks must lose them.`
          }
        />
        <p className="muted small">
          {eg.machinesReporting} machine(s) reporting{eg.machinesSilent.length ? `, silent: ${eg.machinesSilent.join(", ")}` : ""}; window{" "}
          {when(eg.from)} to {when(eg.to)}
        </p>
        {eg.byClass.length === 0 ? (
          <p className="muted">No matches.</p>
        ) : (
          <table className="table compact" data-testid="egress-classes">
            <tbody>
              {eg.byClass.map((c) => (
                <tr key={c.class}>
                  <td>{c.class}</td>
                  <td className="barcell">
                    <span className="bar" data-w={Math.round((Number(c.count) / max) * 10)} />
                  </td>
                  <td className="mono">{c.count}</td>
                </tr>
              ))}
            </tbody>
          </table>
        )}
        {eg.destinations.length > 0 && (
          <details>
            <summary>Sampled destinations ({eg.destinations.length})</summary>
            <table className="table compact">
              <tbody>
                {eg.destinations.map((d, i) => (
                  <tr key={i}>
                    <td>{d.class}</td>
                    <td className="mono">{d.destination}</td>
                    <td>
                      <Link href={`/tasks/${d.task}`} className="mono">
                        {d.task}
                      </Link>
                    </td>
                  </tr>
                ))}
              </tbody>
            </table>
          </details>
        )}
      </div>
      <div>
        <h3>
          Seccomp <span className="pill">{sc.mode || "unknown"}</span>
        </h3>
        <Advice
          safe={sc.safeToEnforce}
          enforced={sc.mode === "enforce"}
          what={`worker.pools.${pool}.security.seccomp: enforce`}
          notYet={
            sc.mode !== "log"
              ? "Only log mode records what enforce would refuse: set seccomp: log first and let tasks run."
              : sc.tasksObserved === 0
                ? "No task has run under log mode yet."
                : `${sc.total} call(s) enforce would refuse, listed below.`
          }
        />
        <p className="muted small">{sc.tasksObserved} task(s) observed under log mode</p>
        {sc.syscalls.length > 0 && (
          <table className="table compact" data-testid="seccomp-syscalls">
            <thead>
              <tr>
                <th>Syscall</th>
                <th>Count</th>
                <th>Tasks</th>
              </tr>
            </thead>
            <tbody>
              {sc.syscalls.map((s) => (
                <tr key={s.syscall}>
                  <td className="mono">{s.syscall}</td>
                  <td>{s.count}</td>
                  <td>
                    {s.tasks}{" "}
                    {s.taskIds.slice(0, 3).map((id) => (
                      <Link key={id} href={`/tasks/${id}`} className="mono small">
                        {id}{" "}
                      </Link>
                    ))}
                  </td>
                </tr>
              ))}
            </tbody>
          </table>
        )}
      </div>
    </div>
  );
}

function Advice({ safe, enforced, what, notYet }: { safe: boolean; enforced: boolean; what: string; notYet: string }) {
  if (enforced) return <p className="advice ok">Enforced.</p>;
  if (safe)
    return (
      <div className="advice ok" data-testid="advice-safe">
        Safe to enforce. Set <code>{what}</code>.
      </div>
    );
  return <p className="advice wait">Not yet: {notYet}</p>;
}
