-- +goose Up
-- What seccomp log mode recorded for an attempt: per syscall, how many
-- kernel records its container left (a lower bound: the kernel rate-limits
-- them). Agents send cumulative totals, so a row only grows (GREATEST in
-- store/seccomp.go) and a resent report changes nothing. The row with
-- syscall '' (count 0) marks an attempt that ran under log mode at all, so
-- "no syscall recorded" can be told from "nothing observed".
CREATE TABLE attempt_seccomp (
    task_id text NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    attempt int NOT NULL,
    syscall text NOT NULL,
    count   bigint NOT NULL CHECK (count >= 0),
    PRIMARY KEY (task_id, attempt, syscall)
);

-- +goose Down
DROP TABLE attempt_seccomp;
