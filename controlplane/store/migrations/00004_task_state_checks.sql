-- +goose Up
-- The task and attempt states are closed sets, listed (with the moves
-- between them and who makes each) in store/states.go; Postgres refuses
-- any other value, so a typo in a query fails loudly instead of stranding
-- a row in a state nothing reads. A test checks these lists against the
-- Go constants.
ALTER TABLE tasks ADD CONSTRAINT tasks_state_known
    CHECK (state IN ('PENDING', 'SCHEDULED', 'RUNNING', 'SUCCEEDED', 'FAILED', 'CANCELLED', 'TIMED_OUT'));
ALTER TABLE tasks ADD CONSTRAINT tasks_counts_sane
    CHECK (attempts >= 0 AND retries >= 0 AND cpu_millis >= 0 AND memory_bytes >= 0 AND gpus >= 0);
ALTER TABLE task_attempts ADD CONSTRAINT task_attempts_state_known
    CHECK (state IN ('SCHEDULED', 'RUNNING', 'SUCCEEDED', 'FAILED', 'CANCELLED', 'TIMED_OUT', 'LOST'));
ALTER TABLE task_attempts ADD CONSTRAINT task_attempts_number_positive CHECK (number >= 1);

-- +goose Down
ALTER TABLE task_attempts DROP CONSTRAINT task_attempts_number_positive;
ALTER TABLE task_attempts DROP CONSTRAINT task_attempts_state_known;
ALTER TABLE tasks DROP CONSTRAINT tasks_counts_sane;
ALTER TABLE tasks DROP CONSTRAINT tasks_state_known;
