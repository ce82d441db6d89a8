-- +goose Up
-- Workspaces: created by bootstrap (the first) and later by admins; never
-- change state. storage_* hold the workspace's sealed storage credentials.
CREATE TABLE workspaces (
    id             text PRIMARY KEY,
    name           text NOT NULL UNIQUE,
    created_at     timestamptz NOT NULL DEFAULT now(),
    storage_public jsonb,
    storage_key_id text,
    storage_sealed bytea,
    CHECK ((storage_key_id IS NULL) = (storage_sealed IS NULL))
);

-- Tokens: active until revoked (revoked_at set by RevokeToken, never
-- cleared). Only the SHA-256 of the secret is stored.
CREATE TABLE tokens (
    id           text PRIMARY KEY,
    workspace_id text NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    name         text NOT NULL,
    hash         bytea NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    last_used_at timestamptz,
    revoked_at   timestamptz
);
CREATE INDEX tokens_workspace_id ON tokens (workspace_id);

-- Secrets: one row per (workspace, name), sealed with key key_id.
CREATE TABLE secrets (
    id           text PRIMARY KEY,
    workspace_id text NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    name         text NOT NULL,
    value_keys   text[] NOT NULL,
    key_id       text NOT NULL,
    sealed       bytea NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    UNIQUE (workspace_id, name)
);

-- +goose Down
DROP TABLE secrets;
DROP TABLE tokens;
DROP TABLE workspaces;
