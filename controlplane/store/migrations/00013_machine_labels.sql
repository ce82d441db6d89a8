-- +goose Up
-- Labels given at `levers9 machine create --label k=v` (a JSON object of
-- strings, validated like Kubernetes labels by the API). A pool's
-- nodeSelector is matched against them when the machine enrolls, and the
-- agent learns them from its enrollment and reports them in its inventory.
ALTER TABLE machines ADD COLUMN labels jsonb NOT NULL DEFAULT '{}'
    CHECK (jsonb_typeof(labels) = 'object');

-- +goose Down
ALTER TABLE machines DROP COLUMN labels;
