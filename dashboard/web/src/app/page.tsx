"use client";

import Link from "next/link";
import { useEffect, useState } from "react";
import { call, type Pool, type Task } from "@/lib/api";
import { ago } from "@/lib/format";
import { useSignedIn } from "@/lib/session";
import { Badge, Cmd, Empty, PageHead, Problem } from "@/components/ui";

export default function Overview() {
  const session = useSignedIn();
  const [tasks, setTasks] = useState<Task[] | null>(null);
  const [pools, setPools] = useState<Pool[] | null>(null);
  const [error, setError] = useState<unknown>(null);
  useEffect(() => {
    if (!session) return;
    const load = () => {
      call<{ tasks: Task[] }>("GET", "/api/tasks?pageSize=100")
        .then((r) => setTasks(r.tasks))
        .catch(setError);
      call<{ pools: Pool[] }>("GET", "/api/pools")
        .then((r) => setPools(r.pools))
        .catch(setError);
    };
    load();
    const t = setInterval(load, 5000);
    return () => clearInterval(t);
  }, [session]);
  if (!session) return null;
  const count = (s: string[]) => tasks?.filter((t) => s.includes(t.state)).length ?? 0;
  const machines = pools?.reduce((n, p) => n + p.machines, 0) ?? 0;
  const online = pools?.reduce((n, p) => n + p.machinesOnline, 0) ?? 0;
  const gpusTotal = pools?.reduce((n, p) => n + p.gpusTotal, 0) ?? 0;
  const gpusFree = pools?.reduce((n, p) => n + p.gpusFree, 0) ?? 0;
  return (
    <>
      <PageHead title="Overview" />
      <Problem error={error} />
      <div className="stats">
        <Stat label="Running" value={count(["running"])} href="/tasks?state=running" />
        <Stat label="Waiting" value={count(["pending", "scheduled"])} href="/tasks?state=pending,scheduled" />
        <Stat label="Failed (recent)" value={count(["failed", "timed_out"])} href="/tasks?state=failed,timed_out" />
        <Stat label="Machines online" value={`${online} / ${machines}`} href="/machines" />
        <Stat label="GPUs free" value={`${gpusFree} / ${gpusTotal}`} href="/machines" />
      </div>
      {pools && machines === 0 && (
        <Empty title="No machines yet">
          <p>Add a machine to a pool; it runs the agent, which dials out to the controlplane:</p>
          <Cmd>levers9 machine create --pool default</Cmd>
        </Empty>
      )}
      <section className="card">
        <h2>Recent tasks</h2>
        {tasks && tasks.length === 0 && (
          <Empty title="No tasks yet">
            <p>Run one from the CLI:</p>
            <Cmd>levers9 run -- echo hello</Cmd>
          </Empty>
        )}
        {tasks && tasks.length > 0 && (
          <table className="table">
            <tbody>
              {tasks.slice(0, 8).map((t) => (
                <tr key={t.id}>
                  <td>
                    <Link href={`/tasks/${t.id}`} className="mono">
                      {t.id}
                    </Link>
                  </td>
                  <td>
                    <Badge state={t.state} />
                  </td>
                  <td className="mono ellipsis">{t.command.join(" ")}</td>
                  <td className="muted">{ago(t.createdAt)}</td>
                </tr>
              ))}
            </tbody>
          </table>
        )}
      </section>
    </>
  );
}

function Stat({ label, value, href }: { label: string; value: number | string; href: string }) {
  return (
    <Link href={href} className="stat">
      <span className="stat-value">{value}</span>
      <span className="stat-label">{label}</span>
    </Link>
  );
}
