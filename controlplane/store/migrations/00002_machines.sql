-- +goose Up
-- The agent CA: one row ('agents'), created by the first controlplane to
-- start (under an advisory lock); its key is sealed like every secret.
CREATE TABLE agent_ca (
    id         text PRIMARY KEY,
    cert_pem   text NOT NULL,
    key_id     text NOT NULL,
    key_sealed bytea NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

-- Machines. States (closed set, derived from the columns):
--   pending:  CreateMachine inserts it; enrolled_at IS NULL.
--   enrolled: Enroll sets enrolled_at and the certificate's serial/expiry;
--             renewals replace them. Online or offline is presence (the
--             tunnel registry), not a column.
--   deleted:  DeleteMachine sets deleted_at; the row stays for audit and its
--             certificate is refused from then on. Nothing moves it back.
CREATE TABLE machines (
    id             text PRIMARY KEY,
    workspace_id   text NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    name           text NOT NULL,
    pool           text NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    enrolled_at    timestamptz,
    deleted_at     timestamptz,
    cert_serial    text,
    cert_not_after timestamptz,
    agent_version  text NOT NULL DEFAULT '',
    hostname       text NOT NULL DEFAULT '',
    last_heartbeat timestamptz,
    transport      text NOT NULL DEFAULT '',
    inventory      jsonb
);
CREATE UNIQUE INDEX machines_workspace_name ON machines (workspace_id, name) WHERE deleted_at IS NULL;
CREATE INDEX machines_workspace_pool ON machines (workspace_id, pool);

-- Join tokens: single use. used_at is set once by Enroll; expired or used
-- tokens are refused and never reset.
CREATE TABLE join_tokens (
    id         text PRIMARY KEY,
    machine_id text NOT NULL REFERENCES machines (id) ON DELETE CASCADE,
    hash       bytea NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL,
    used_at    timestamptz
);
CREATE INDEX join_tokens_machine_id ON join_tokens (machine_id);

-- +goose Down
DROP TABLE join_tokens;
DROP TABLE machines;
DROP TABLE agent_ca;
