-- +goose Up
-- A workspace's logins to private image registries, one per registry host.
-- The password (or token) is sealed (key_id, sealed) with the AAD
-- store.RegistryAAD(workspace, host); the username is not a secret.
CREATE TABLE registry_credentials (
    id           text PRIMARY KEY,
    workspace_id text NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    host         text NOT NULL,
    username     text NOT NULL,
    key_id       text NOT NULL,
    sealed       bytea NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    UNIQUE (workspace_id, host)
);

-- +goose Down
DROP TABLE registry_credentials;
