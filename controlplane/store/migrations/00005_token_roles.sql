-- +goose Up
-- Every token has a role, a closed set listed in store/tokens.go (Role);
-- controlplane/auth/roles.go says which role may call which RPC. Tokens
-- made before roles existed could do everything, so they become admin. New
-- rows must name their role: there is no default, so a forgotten role is a
-- refused insert rather than a quiet grant.
ALTER TABLE tokens ADD COLUMN role text NOT NULL DEFAULT 'admin';
ALTER TABLE tokens ALTER COLUMN role DROP DEFAULT;
ALTER TABLE tokens ADD CONSTRAINT tokens_role_known
    CHECK (role IN ('admin', 'member', 'machine-join'));

-- +goose Down
ALTER TABLE tokens DROP CONSTRAINT tokens_role_known;
ALTER TABLE tokens DROP COLUMN role;
