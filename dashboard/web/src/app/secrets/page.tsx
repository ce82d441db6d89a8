"use client";

import { useEffect, useState } from "react";
import { call, type SecretName } from "@/lib/api";
import { ago } from "@/lib/format";
import { useSignedIn } from "@/lib/session";
import { Cmd, Empty, PageHead, Problem } from "@/components/ui";

export default function SecretsPage() {
  const session = useSignedIn();
  const [secrets, setSecrets] = useState<SecretName[] | null>(null);
  const [error, setError] = useState<unknown>(null);
  useEffect(() => {
    if (session) call<{ secrets: SecretName[] }>("GET", "/api/secrets").then((r) => setSecrets(r.secrets), setError);
  }, [session]);
  if (!session) return null;
  return (
    <>
      <PageHead title="Secrets" />
      <p className="muted">Names and keys only: values never leave the controlplane.</p>
      <Problem error={error} />
      {secrets && secrets.length === 0 && (
        <Empty title="No secrets yet">
          <p>Store one from the CLI, then pass it to a task with <code>--secret NAME</code>:</p>
          <Cmd>printf &apos;USER=app\nPASSWORD=hunter2\n&apos; | levers9 secret put db</Cmd>
        </Empty>
      )}
      {secrets && secrets.length > 0 && (
        <table className="table" data-testid="secrets-table">
          <thead>
            <tr>
              <th>Name</th>
              <th>Keys</th>
              <th>Updated</th>
            </tr>
          </thead>
          <tbody>
            {secrets.map((s) => (
              <tr key={s.name}>
                <td>
                  <b>{s.name}</b>
                </td>
                <td className="mono">{s.keys.join(", ")}</td>
                <td className="muted">{ago(s.updatedAt ?? s.createdAt)}</td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
    </>
  );
}
