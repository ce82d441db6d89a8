-- +goose Up
-- Tasks. state is a closed set; the moves (every other is refused by the
-- conditional UPDATEs in store/tasks.go):
--   PENDING   -> SCHEDULED (placed; a new attempt row) | CANCELLED
--   SCHEDULED -> RUNNING | SUCCEEDED | FAILED | CANCELLED | TIMED_OUT
--              | PENDING (attempt lost, retries left) | FAILED (lost, none left)
--   RUNNING   -> the same as SCHEDULED
-- Terminal: SUCCEEDED, FAILED, CANCELLED, TIMED_OUT; nothing leaves them.
CREATE TABLE tasks (
    id               text PRIMARY KEY,
    workspace_id     text NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    pool             text NOT NULL,
    -- The submitted TaskSpec as protojson, defaults applied.
    spec             jsonb NOT NULL,
    cpu_millis       bigint NOT NULL,
    memory_bytes     bigint NOT NULL,
    gpus             int NOT NULL,
    gpu_type         text NOT NULL DEFAULT '',
    retries          int NOT NULL,
    state            text NOT NULL,
    -- Number of the latest attempt (0: never placed).
    attempts         int NOT NULL DEFAULT 0,
    cancel_requested boolean NOT NULL DEFAULT false,
    exit_code        int,
    message          text NOT NULL DEFAULT '',
    idempotency_key  text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    finished_at      timestamptz
);
CREATE UNIQUE INDEX tasks_idempotency ON tasks (workspace_id, idempotency_key) WHERE idempotency_key IS NOT NULL;
CREATE INDEX tasks_workspace_created ON tasks (workspace_id, created_at DESC, id DESC);
CREATE INDEX tasks_pending ON tasks (pool, created_at) WHERE state = 'PENDING';

-- Attempts: one row per placement. An active attempt (SCHEDULED, RUNNING)
-- holds its resources on its machine; the scheduler sums them.
--   SCHEDULED -> RUNNING | LOST | a terminal state
--   RUNNING   -> LOST | SUCCEEDED | FAILED | CANCELLED | TIMED_OUT
CREATE TABLE task_attempts (
    task_id       text NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    number        int NOT NULL,
    machine_id    text NOT NULL,
    state         text NOT NULL,
    cpu_millis    bigint NOT NULL,
    memory_bytes  bigint NOT NULL,
    gpu_devices   text[] NOT NULL DEFAULT '{}',
    scheduled_at  timestamptz NOT NULL DEFAULT now(),
    started_at    timestamptz,
    finished_at   timestamptz,
    exit_code     int,
    message       text NOT NULL DEFAULT '',
    dropped_lines bigint NOT NULL DEFAULT 0,
    image_digest  text NOT NULL DEFAULT '',
    PRIMARY KEY (task_id, number)
);
CREATE INDEX task_attempts_active ON task_attempts (machine_id) WHERE state IN ('SCHEDULED', 'RUNNING');

-- +goose Down
DROP TABLE task_attempts;
DROP TABLE tasks;
