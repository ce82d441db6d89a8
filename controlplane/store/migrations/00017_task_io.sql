-- +goose Up
-- The result channel. tasks.input is TaskSpec.input (at most 1 MiB), kept
-- out of the spec JSON so reads that list tasks never carry it; NULL for
-- none. Every attempt's push hands it to the agent.
ALTER TABLE tasks ADD COLUMN input bytea
    CONSTRAINT tasks_input_size CHECK (octet_length(input) <= 1048576);

-- What an attempt's container left in /run/levers9/io/result, from the
-- agent's terminal update: result is NULL when it wrote none (or one the
-- agent refused: result_error says why, "the result is N bytes; the limit
-- is 8 MiB"), and may be empty when it wrote an empty file. Read only by
-- GetTaskResult, never with the attempt lists.
ALTER TABLE task_attempts ADD COLUMN result bytea
    CONSTRAINT task_attempts_result_size CHECK (octet_length(result) <= 8388608);
ALTER TABLE task_attempts ADD COLUMN result_error text NOT NULL DEFAULT '';

-- +goose Down
ALTER TABLE task_attempts DROP COLUMN result_error;
ALTER TABLE task_attempts DROP COLUMN result;
ALTER TABLE tasks DROP COLUMN input;
