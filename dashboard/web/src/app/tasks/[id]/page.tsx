"use client";

import Link from "next/link";
import { useCallback, useEffect, useRef, useState } from "react";
import { useParams } from "next/navigation";
import { call, terminalStates, wsURL, type AppliedSecurity, type Task, type TaskEvent } from "@/lib/api";
import { ago, bytes, duration, when } from "@/lib/format";
import { useSignedIn } from "@/lib/session";
import { useLiveSocket } from "@/lib/ws";
import { Badge, KV, Live, PageHead, Problem } from "@/components/ui";

type Line =
  | { kind: "log"; key: number; attempt: number; stream: string; text: string; dropped: number }
  | { kind: "marker"; key: number; attempt: number; text: string };

// A browser tab keeps this many lines; older ones scroll away (the API's
// logs route still has them all).
const maxLines = 20000;

export default function TaskPage() {
  const session = useSignedIn();
  const { id } = useParams<{ id: string }>();
  const [task, setTask] = useState<Task | null>(null);
  const [lines, setLines] = useState<Line[]>([]);
  const [error, setError] = useState<unknown>(null);
  const [cancelling, setCancelling] = useState(false);
  const cursor = useRef("");
  const lastAttempt = useRef(0);
  const seq = useRef(0);
  const follow = useRef(true);
  const logBox = useRef<HTMLDivElement>(null);

  const load = useCallback(() => {
    call<{ task: Task }>("GET", `/api/tasks/${encodeURIComponent(id)}`).then((r) => setTask(r.task), setError);
  }, [id]);
  useEffect(() => {
    if (session) load();
  }, [session, load]);

  const status = useLiveSocket(
    session ? () => wsURL(`/api/ws/tasks/${encodeURIComponent(id)}${cursor.current ? "?cursor=" + encodeURIComponent(cursor.current) : ""}`) : null,
    (m) => {
      if (m.type === "end") {
        load();
        return;
      }
      if (m.type === "error") {
        setError(new Error((m.error as { message: string }).message));
        return;
      }
      if (m.type !== "event") return;
      const ev = m as unknown as TaskEvent;
      cursor.current = ev.cursor;
      const add: Line[] = [];
      // An attempt marker where each attempt's events begin (the API marks
      // retries with state.newAttempt; the number changing says the same).
      if (ev.attempt && ev.attempt !== lastAttempt.current) {
        const on = ev.state?.machineId ? ` on ${ev.state.machineId}` : "";
        add.push({ kind: "marker", key: seq.current++, attempt: ev.attempt, text: `attempt ${ev.attempt}${on}` });
        lastAttempt.current = ev.attempt;
      }
      if (ev.log) {
        add.push({ kind: "log", key: seq.current++, attempt: ev.attempt, stream: ev.log.stream, text: ev.log.text, dropped: ev.log.droppedBefore ?? 0 });
      }
      if (ev.state) {
        const s = ev.state;
        if (terminalStates.has(s.attemptState) || s.attemptState === "lost") {
          const head = `attempt ${ev.attempt} ${s.attemptState}`;
          const exit = s.exitCode !== undefined ? `, exit code ${s.exitCode}` : "";
          // The controlplane's summary may already begin with the same words.
          let why = s.summary || s.message || "";
          if (why.startsWith(head)) why = why.slice(head.length).replace(/^:\s*/, "");
          add.push({ kind: "marker", key: seq.current++, attempt: ev.attempt, text: `${head}${exit}${why ? `: ${why}` : ""}` });
        }
        load();
      }
      if (add.length) setLines((old) => (old.length + add.length > maxLines ? [...old, ...add].slice(-maxLines) : [...old, ...add]));
    },
    [session?.email, id],
  );

  // Keep the newest line in view unless the reader scrolled up.
  useEffect(() => {
    const box = logBox.current;
    if (box && follow.current) box.scrollTop = box.scrollHeight;
  }, [lines]);

  const cancel = async () => {
    if (!session) return;
    setCancelling(true);
    try {
      const r = await call<{ task: Task }>("POST", `/api/tasks/${encodeURIComponent(id)}/cancel`, { csrf: session.csrfToken });
      setTask(r.task);
    } catch (e) {
      setError(e);
    } finally {
      setCancelling(false);
    }
  };

  if (!session) return null;
  const done = task ? terminalStates.has(task.state) : false;
  return (
    <>
      <PageHead title={`Task ${id}`}>
        {task && <Badge state={task.state} />}
        <Live status={status} />
        {task && !done && (
          <button className="danger" onClick={cancel} disabled={cancelling} data-testid="cancel">
            {cancelling ? "Cancelling…" : "Cancel task"}
          </button>
        )}
      </PageHead>
      <p>
        <Link href="/tasks">← all tasks</Link>
      </p>
      <Problem error={error} />
      {task && (
        <div className="grid2">
          <section className="card">
            <h2>Task</h2>
            <KV
              rows={[
                ["State", <Badge key="s" state={task.state} />],
                ["Exit code", <span key="e" data-testid="exit-code" className="mono">{task.exitCode ?? "—"}</span>],
                ["Message", task.message],
                ["Command", <code key="c">{task.command.join(" ")}</code>],
                ["Image", <code key="i">{task.image}</code>],
                ["Pool", task.pool],
                ["Machine", task.machineId],
                ["Resources", `${(task.cpuMillis ?? 0) / 1000} CPU, ${bytes(task.memoryBytes)}${task.gpus ? `, ${task.gpus} GPU ${task.gpuType ?? ""}` : ""}`],
                ["Retries", task.retries],
                ["Timeout", task.timeoutSeconds ? `${task.timeoutSeconds}s` : ""],
                ["Secrets", task.secrets?.join(", ")],
                ["Env", task.envNames?.join(", ")],
                ["Created", `${when(task.createdAt)} (${ago(task.createdAt)})`],
                ["Took", duration(task.createdAt, task.finishedAt)],
              ]}
            />
          </section>
          <section className="card">
            <h2>Applied security</h2>
            <Security sec={task.appliedSecurity} />
            {task.seccompLogged && task.seccompLogged.length > 0 && (
              <>
                <h3>Seccomp (log mode): syscalls enforce would refuse</h3>
                <table className="table compact">
                  <tbody>
                    {task.seccompLogged.map((s) => (
                      <tr key={s.syscall}>
                        <td className="mono">{s.syscall}</td>
                        <td>{s.count}</td>
                      </tr>
                    ))}
                  </tbody>
                </table>
              </>
            )}
          </section>
        </div>
      )}
      <section className="card">
        <h2>Logs</h2>
        <div
          className="logs"
          ref={logBox}
          data-testid="logs"
          onScroll={(e) => {
            const b = e.currentTarget;
            follow.current = b.scrollHeight - b.scrollTop - b.clientHeight < 40;
          }}
        >
          {lines.length === 0 && <span className="muted">{done ? "No output." : "Waiting for output…"}</span>}
          {lines.map((l) =>
            l.kind === "marker" ? (
              <div key={l.key} className="marker" data-testid="attempt-marker" data-attempt={l.attempt}>
                ── {l.text} ──
              </div>
            ) : (
              <div key={l.key} className={`line ${l.stream}`} data-attempt={l.attempt}>
                {l.dropped > 0 && <span className="dropped">[{l.dropped} lines dropped on the machine] </span>}
                {l.text}
              </div>
            ),
          )}
        </div>
      </section>
      {task?.attempts && task.attempts.length > 0 && (
        <section className="card">
          <h2>Attempts</h2>
          <div className="scroll">
            <table className="table">
              <thead>
                <tr>
                  <th>#</th>
                  <th>State</th>
                  <th>Machine</th>
                  <th>Started</th>
                  <th>Took</th>
                  <th>Exit</th>
                  <th>Why</th>
                </tr>
              </thead>
              <tbody>
                {task.attempts.map((a) => (
                  <tr key={a.number}>
                    <td>{a.number}</td>
                    <td>
                      <Badge state={a.state} />
                    </td>
                    <td className="mono">{a.machineId ?? "—"}</td>
                    <td className="muted">{when(a.startedAt)}</td>
                    <td>{duration(a.startedAt, a.finishedAt)}</td>
                    <td className="mono">{a.exitCode ?? "—"}</td>
                    <td>{a.summary || a.message || a.reason || ""}</td>
                  </tr>
                ))}
              </tbody>
            </table>
          </div>
        </section>
      )}
    </>
  );
}

function Security({ sec }: { sec?: AppliedSecurity }) {
  if (!sec || !sec.runtime) return <p className="muted">Not known yet: the machine reports it when the container starts.</p>;
  return (
    <KV
      rows={[
        ["Runtime", `${sec.runtime} ${sec.runtimeVersion ?? ""}`],
        ["Profile", sec.profile],
        ["Seccomp", sec.seccompMode],
        ["Capabilities", sec.capabilities?.length ? sec.capabilities.join(", ") : "none"],
        ["NET_RAW dropped", sec.netRawDropped ? "yes" : "no"],
        ["No new privileges", sec.noNewPrivileges ? "yes" : "no"],
        ["Masked paths", sec.maskedPaths?.length ? `${sec.maskedPaths.length}` : sec.pathsNote],
        ["AppArmor", sec.apparmorProfile || sec.apparmorNote],
        ["Egress", sec.egressMode],
        ["Notes", sec.notes?.join("; ")],
      ]}
    />
  );
}
