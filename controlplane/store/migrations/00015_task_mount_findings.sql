-- +goose Up
-- The volume mounts of a task that worker.volumeMountValidation judged
-- unsafe and its log mode let through, judged at submit: a JSON array of
-- {"volume", "path", "reason"}. The security report sums them per pool.
ALTER TABLE tasks ADD COLUMN mount_findings jsonb NOT NULL DEFAULT '[]'
    CHECK (jsonb_typeof(mount_findings) = 'array');

-- +goose Down
ALTER TABLE tasks DROP COLUMN mount_findings;
