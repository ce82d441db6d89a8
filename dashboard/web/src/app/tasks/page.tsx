"use client";

import Link from "next/link";
import { Suspense, useEffect, useMemo, useState } from "react";
import { usePathname, useRouter, useSearchParams } from "next/navigation";
import { call, taskStates, wsURL, type Pool, type Task } from "@/lib/api";
import { ago, duration } from "@/lib/format";
import { useSignedIn } from "@/lib/session";
import { useLiveSocket } from "@/lib/ws";
import { Badge, Cmd, Empty, Live, PageHead, Problem } from "@/components/ui";

export default function TasksPage() {
  return (
    <Suspense>
      <Tasks />
    </Suspense>
  );
}

function Tasks() {
  const session = useSignedIn();
  const params = useSearchParams();
  const router = useRouter();
  const path = usePathname();
  const states = useMemo(() => (params.get("state") ?? "").split(",").filter(Boolean), [params]);
  const pool = params.get("pool") ?? "";
  const [pools, setPools] = useState<Pool[]>([]);
  const [tasks, setTasks] = useState<Map<string, Task> | null>(null);
  const [error, setError] = useState<unknown>(null);

  useEffect(() => {
    if (session) call<{ pools: Pool[] }>("GET", "/api/pools").then((r) => setPools(r.pools), setError);
  }, [session]);

  const query = new URLSearchParams();
  if (states.length) query.set("state", states.join(","));
  if (pool) query.set("pool", pool);
  const qs = query.toString();

  const status = useLiveSocket(
    session ? () => wsURL(`/api/ws/tasks${qs ? "?" + qs : ""}`) : null,
    (m) => {
      if (m.type === "snapshot") {
        setTasks(new Map((m.tasks as Task[]).map((t) => [t.id, t])));
      } else if (m.type === "task") {
        const t = m.task as Task;
        setTasks((old) => new Map(old ?? []).set(t.id, t));
      } else if (m.type === "removed") {
        setTasks((old) => {
          const n = new Map(old ?? []);
          n.delete(m.id as string);
          return n;
        });
      } else if (m.type === "error") {
        setError(new Error((m.error as { message: string }).message));
      }
    },
    [session?.email, qs],
  );

  const setFilter = (key: string, value: string) => {
    const q = new URLSearchParams(params.toString());
    if (value) q.set(key, value);
    else q.delete(key);
    setTasks(null);
    router.replace(`${path}?${q.toString()}`);
  };
  const toggleState = (s: string) => {
    const next = states.includes(s) ? states.filter((x) => x !== s) : [...states, s];
    setFilter("state", next.join(","));
  };

  if (!session) return null;
  const rows = [...(tasks?.values() ?? [])].sort((a, b) => (b.createdAt ?? "").localeCompare(a.createdAt ?? ""));
  return (
    <>
      <PageHead title="Tasks">
        <Live status={status} />
      </PageHead>
      <div className="filters" data-testid="task-filters">
        <div className="chips">
          {taskStates.map((s) => (
            <button
              key={s}
              className={`chip ${states.includes(s) ? "on" : ""}`}
              onClick={() => toggleState(s)}
              aria-pressed={states.includes(s)}
            >
              {s.replace("_", " ")}
            </button>
          ))}
        </div>
        <label className="inline">
          Pool
          <select value={pool} onChange={(e) => setFilter("pool", e.target.value)}>
            <option value="">all pools</option>
            {pools.map((p) => (
              <option key={p.name} value={p.name}>
                {p.name}
              </option>
            ))}
          </select>
        </label>
      </div>
      <Problem error={error} />
      {tasks && rows.length === 0 && (
        <Empty title={states.length || pool ? "No task matches these filters" : "No tasks yet"}>
          <p>Run one from the CLI and it shows up here as it happens:</p>
          <Cmd>levers9 run -- sh -c &apos;echo hello from $(uname -n)&apos;</Cmd>
        </Empty>
      )}
      {rows.length > 0 && (
        <div className="scroll">
          <table className="table" data-testid="tasks-table">
            <thead>
              <tr>
                <th>Task</th>
                <th>State</th>
                <th>Command</th>
                <th className="hide-sm">Image</th>
                <th>Pool</th>
                <th className="hide-sm">Attempts</th>
                <th>Exit</th>
                <th>Created</th>
                <th className="hide-sm">Took</th>
              </tr>
            </thead>
            <tbody>
              {rows.map((t) => (
                <tr key={t.id} data-task={t.id}>
                  <td>
                    <Link href={`/tasks/${t.id}`} className="mono">
                      {t.id}
                    </Link>
                  </td>
                  <td>
                    <Badge state={t.state} />
                  </td>
                  <td className="mono ellipsis" title={t.command.join(" ")}>
                    {t.command.join(" ")}
                  </td>
                  <td className="mono ellipsis hide-sm">{t.image}</td>
                  <td>{t.pool}</td>
                  <td className="hide-sm">{t.attempts?.length ?? 0}</td>
                  <td className="mono">{t.exitCode ?? "—"}</td>
                  <td className="muted">{ago(t.createdAt)}</td>
                  <td className="muted hide-sm">{duration(t.createdAt, t.finishedAt)}</td>
                </tr>
              ))}
            </tbody>
          </table>
        </div>
      )}
    </>
  );
}
