"use client";

import { useCallback, useEffect, useState, type FormEvent } from "react";
import { call, type Token } from "@/lib/api";
import { ago } from "@/lib/format";
import { useSignedIn } from "@/lib/session";
import { Badge, Cmd, Empty, PageHead, Problem } from "@/components/ui";

const roles: Token["role"][] = ["admin", "member", "machine_join"];

export default function TokensPage() {
  const session = useSignedIn();
  const [tokens, setTokens] = useState<Token[] | null>(null);
  const [showRevoked, setShowRevoked] = useState(false);
  const [error, setError] = useState<unknown>(null);
  const [created, setCreated] = useState<{ token: Token; secret: string } | null>(null);
  const [confirm, setConfirm] = useState("");

  const load = useCallback(() => {
    call<{ tokens: Token[] }>("GET", `/api/tokens${showRevoked ? "?includeRevoked=true" : ""}`).then((r) => {
      setTokens(r.tokens);
      setError(null);
    }, setError);
  }, [showRevoked]);
  useEffect(() => {
    if (session) load();
  }, [session, load]);

  if (!session) return null;

  const create = async (e: FormEvent) => {
    e.preventDefault();
    const form = e.currentTarget as HTMLFormElement;
    const data = new FormData(form);
    try {
      const r = await call<{ token: Token; secret: string }>("POST", "/api/tokens", {
        body: { name: String(data.get("name") ?? ""), role: String(data.get("role") ?? "member") },
        csrf: session.csrfToken,
      });
      setCreated(r);
      form.reset();
      load();
    } catch (err) {
      setError(err);
    }
  };
  const revoke = async (id: string) => {
    setConfirm("");
    try {
      await call("DELETE", `/api/tokens/${encodeURIComponent(id)}`, { csrf: session.csrfToken });
      load();
    } catch (err) {
      setError(err);
    }
  };

  return (
    <>
      <PageHead title="Tokens" />
      <Problem error={error} />
      {created && (
        <div className="secretbox" data-testid="new-secret">
          <p>
            Token <b>{created.token.name}</b> ({created.token.role}) created. Copy its secret now: <b>it is not shown again</b>.
          </p>
          <Cmd>{created.secret}</Cmd>
          <button onClick={() => setCreated(null)}>I have copied it</button>
        </div>
      )}
      {session.role === "admin" && (
        <form className="card row" onSubmit={create} data-testid="create-token">
          <label className="inline">
            Name
            <input name="name" placeholder="laptop" required />
          </label>
          <label className="inline">
            Role
            <select name="role" defaultValue="member">
              {roles.map((r) => (
                <option key={r} value={r}>
                  {r}
                </option>
              ))}
            </select>
          </label>
          <button type="submit" className="primary">
            Create token
          </button>
        </form>
      )}
      <label className="inline">
        <input type="checkbox" checked={showRevoked} onChange={(e) => setShowRevoked(e.target.checked)} /> show revoked
      </label>
      {tokens && tokens.length === 0 && (
        <Empty title="No tokens">
          <p>Create one above, or from the CLI:</p>
          <Cmd>levers9 token create --name laptop --role member</Cmd>
        </Empty>
      )}
      {tokens && tokens.length > 0 && (
        <div className="scroll">
          <table className="table" data-testid="tokens-table">
            <thead>
              <tr>
                <th>Name</th>
                <th>Role</th>
                <th>ID</th>
                <th>Created</th>
                <th>Last used</th>
                <th />
              </tr>
            </thead>
            <tbody>
              {tokens.map((t) => (
                <tr key={t.id} data-token={t.name} data-revoked={t.revoked ? "true" : "false"}>
                  <td>
                    <b>{t.name}</b>
                  </td>
                  <td>
                    <span className={`role role-${t.role}`}>{t.role}</span>
                  </td>
                  <td className="mono muted">{t.id}</td>
                  <td className="muted">{ago(t.createdAt)}</td>
                  <td className="muted">{ago(t.lastUsedAt)}</td>
                  <td>
                    {t.revoked ? (
                      <Badge state="revoked" />
                    ) : confirm === t.id ? (
                      <>
                        <button className="danger" onClick={() => revoke(t.id)} data-testid="confirm-revoke">
                          Revoke now
                        </button>{" "}
                        <button onClick={() => setConfirm("")}>Keep</button>
                      </>
                    ) : (
                      <button onClick={() => setConfirm(t.id)} data-testid="revoke">
                        Revoke
                      </button>
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
