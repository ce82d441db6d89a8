-- +goose Up
-- A workspace's volumes: shared filesystems tasks mount (TaskSpec.volumes
-- refers to them by name). The driver keeps the data; this row is the
-- volume's name, owner, driver and quota. States:
--   READY    created by the API (VolumeService.CreateVolume) once the
--            driver made it; tasks may mount it.
--   DELETING set by VolumeService.DeleteVolume when no unfinished task
--            uses it; new tasks may not mount it; the row goes once the
--            driver deleted the data (a failed delete leaves it here for
--            the next DeleteVolume to finish).
CREATE TABLE volumes (
    id           text PRIMARY KEY,
    workspace_id text NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    name         text NOT NULL,
    driver       text NOT NULL,
    quota_bytes  bigint NOT NULL DEFAULT 0 CHECK (quota_bytes >= 0),
    state        text NOT NULL DEFAULT 'READY' CHECK (state IN ('READY', 'DELETING')),
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    UNIQUE (workspace_id, name)
);

-- +goose Down
DROP TABLE volumes;
