-- +goose Up
-- The security controls the runtime really applied to an attempt's
-- container (api levers9.v1.AppliedSecurity as protojson), reported once by
-- the agent with the attempt's RUNNING update. NULL until then, and for
-- attempts that never started a container.
ALTER TABLE task_attempts ADD COLUMN applied_security jsonb;

-- +goose Down
ALTER TABLE task_attempts DROP COLUMN applied_security;
