-- +goose Up
-- Why an attempt failed when its exit code does not say it: a closed set,
-- listed (with what each means for the task) in store/states.go, where a
-- test checks this list against the Go constants. '' is none. summary is
-- the one sentence shown to people; message keeps the full error chain.
ALTER TABLE task_attempts ADD COLUMN reason text NOT NULL DEFAULT '';
ALTER TABLE task_attempts ADD COLUMN summary text NOT NULL DEFAULT '';
ALTER TABLE task_attempts ADD CONSTRAINT task_attempts_reason_known
    CHECK (reason IN ('', 'start_failed', 'image_not_found', 'image_pull_failed', 'mount_failed', 'network_failed', 'out_of_memory', 'pids_limit'));

-- +goose Down
ALTER TABLE task_attempts DROP CONSTRAINT task_attempts_reason_known;
ALTER TABLE task_attempts DROP COLUMN summary;
ALTER TABLE task_attempts DROP COLUMN reason;
