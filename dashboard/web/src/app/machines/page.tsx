"use client";

import { useEffect, useState } from "react";
import { call, wsURL, type Machine, type Pool } from "@/lib/api";
import { ago, bytes, when } from "@/lib/format";
import { useSignedIn } from "@/lib/session";
import { useLiveSocket } from "@/lib/ws";
import { Badge, Cmd, Empty, KV, Live, PageHead, Problem } from "@/components/ui";

export default function MachinesPage() {
  const session = useSignedIn();
  const [pools, setPools] = useState<Pool[] | null>(null);
  const [machines, setMachines] = useState<Map<string, Machine> | null>(null);
  // Heartbeats are not pushed (they are not news): REST every few seconds.
  const [beats, setBeats] = useState<Record<string, string | undefined>>({});
  const [error, setError] = useState<unknown>(null);
  const admin = session?.role === "admin";

  useEffect(() => {
    if (!session) return;
    const load = () => {
      call<{ pools: Pool[] }>("GET", "/api/pools").then((r) => setPools(r.pools), setError);
      if (admin) {
        call<{ machines: Machine[] }>("GET", "/api/machines").then(
          (r) => setBeats(Object.fromEntries(r.machines.map((m) => [m.id, m.lastHeartbeat]))),
          setError,
        );
      }
    };
    load();
    const t = setInterval(load, 5000);
    return () => clearInterval(t);
  }, [session, admin]);

  const status = useLiveSocket(
    admin ? () => wsURL("/api/ws/machines") : null,
    (m) => {
      if (m.type === "snapshot") setMachines(new Map((m.machines as Machine[]).map((x) => [x.id, x])));
      else if (m.type === "machine") {
        const x = m.machine as Machine;
        setMachines((old) => new Map(old ?? []).set(x.id, x));
      } else if (m.type === "removed") {
        setMachines((old) => {
          const n = new Map(old ?? []);
          n.delete(m.id as string);
          return n;
        });
      } else if (m.type === "error") setError(new Error((m.error as { message: string }).message));
    },
    [session?.email, admin],
  );

  if (!session) return null;
  const rows = [...(machines?.values() ?? [])].sort((a, b) => a.pool.localeCompare(b.pool) || (a.name ?? a.id).localeCompare(b.name ?? b.id));
  return (
    <>
      <PageHead title="Machines and pools">{admin && <Live status={status} />}</PageHead>
      <Problem error={error} />
      <h2>Pools</h2>
      {pools && pools.length === 0 && (
        <Empty title="No pools yet">
          <Cmd>levers9 machine create --pool default</Cmd>
        </Empty>
      )}
      <div className="cards">
        {pools?.map((p) => (
          <section key={p.name} className="card pool" data-pool={p.name}>
            <h3>{p.name}</h3>
            <KV
              rows={[
                ["Machines online", `${p.machinesOnline} / ${p.machines}`],
                ["GPUs free", `${p.gpusFree} / ${p.gpusTotal}${p.gpuType ? ` ${p.gpuType}` : ""}`],
                ["Runtime", p.security?.runtime],
                ["Profile", p.security?.profile],
                ["Seccomp", p.security?.seccomp],
                ["Egress", p.security?.egressMode],
              ]}
            />
          </section>
        ))}
      </div>
      <h2>Machines</h2>
      {!admin && <p className="muted">Listing machines needs the admin role.</p>}
      {admin && machines && rows.length === 0 && (
        <Empty title="No machines yet">
          <p>Create one, then run the join script it prints on the machine (it needs no inbound port):</p>
          <Cmd>levers9 machine create --pool default</Cmd>
        </Empty>
      )}
      {admin && rows.length > 0 && (
        <div className="scroll">
          <table className="table" data-testid="machines-table">
            <thead>
              <tr>
                <th>Machine</th>
                <th>Pool</th>
                <th>State</th>
                <th>GPUs</th>
                <th>Last heartbeat</th>
                <th className="hide-sm">Transport</th>
                <th className="hide-sm">Agent</th>
                <th>Inventory</th>
              </tr>
            </thead>
            <tbody>
              {rows.map((m) => (
                <tr key={m.id} data-machine={m.id} data-online={m.online ? "true" : "false"}>
                  <td>
                    <b>{m.name || m.id}</b>
                    <div className="mono muted small">{m.id}</div>
                  </td>
                  <td>{m.pool}</td>
                  <td>
                    <Badge state={m.state} />
                  </td>
                  <td>{m.inventory?.gpus?.length ?? 0}</td>
                  <td className="muted" title={when(beats[m.id] ?? m.lastHeartbeat)}>
                    {ago(beats[m.id] ?? m.lastHeartbeat)}
                  </td>
                  <td className="hide-sm">{m.transport ?? "—"}</td>
                  <td className="hide-sm mono">{m.agentVersion ?? "—"}</td>
                  <td>
                    {m.inventory ? (
                      <details>
                        <summary>
                          {m.inventory.cpus} CPU, {bytes(m.inventory.memoryBytes)}
                        </summary>
                        <KV
                          rows={[
                            ["Host", m.inventory.hostname],
                            ["OS", `${m.inventory.os ?? ""} ${m.inventory.arch ?? ""}, kernel ${m.inventory.kernel ?? "?"}`],
                            ["CPU", m.inventory.cpuModel],
                            ["Disk free", `${bytes(m.inventory.diskFreeBytes)} of ${bytes(m.inventory.diskBytes)}`],
                            ["runc", m.inventory.runcVersion],
                            ["runsc", m.inventory.runscVersion],
                            ["AppArmor", m.inventory.apparmor ? "yes" : "no"],
                            ["GPUs", m.inventory.gpus?.map((g) => `${g.index}: ${g.name} ${bytes(g.memoryBytes)}`).join("; ")],
                          ]}
                        />
                      </details>
                    ) : (
                      <span className="muted">before first heartbeat</span>
                    )}
                  </td>
                </tr>
              ))}
            </tbody>
          </table>
        </div>
      )}
    </>
  );
}
