-- +goose Up
-- A workspace's images built from recipes (ImageService). hash is the
-- recipe's content address (sandbox/image/recipe.Hash); a workspace builds
-- one recipe once. States:
--   BUILDING  a build task runs (build_key is its idempotency key: two
--             callers of one recipe share one task)
--   READY     the build pushed the image; digest and ref are set
--   FAILED    the build task failed; error says why; the next BuildImage
--             starts a new generation
CREATE TABLE images (
    workspace_id text NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    hash         text NOT NULL,
    state        text NOT NULL CHECK (state IN ('BUILDING', 'READY', 'FAILED')),
    recipe       bytea NOT NULL,
    base         text NOT NULL,
    base_digest  text NOT NULL,
    steps        integer NOT NULL DEFAULT 0,
    start_step   integer NOT NULL DEFAULT 0,
    parent       text NOT NULL DEFAULT '',
    generation   integer NOT NULL DEFAULT 1,
    build_key    text NOT NULL,
    task_id      text NOT NULL DEFAULT '',
    digest       text NOT NULL DEFAULT '',
    ref          text NOT NULL DEFAULT '',
    size_bytes   bigint NOT NULL DEFAULT 0,
    error        text NOT NULL DEFAULT '',
    created_at   timestamptz NOT NULL DEFAULT now(),
    built_at     timestamptz,
    PRIMARY KEY (workspace_id, hash)
);
CREATE INDEX images_build_key ON images (workspace_id, build_key);

-- The images after each step a workspace's builds pushed: a later recipe
-- that starts with the same steps (same keys) starts from the deepest one.
CREATE TABLE image_steps (
    workspace_id text NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    key          text NOT NULL,
    digest       text NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workspace_id, key)
);

-- Blobs a workspace uploaded (copy steps' sources), kept in the image
-- registry; a workspace may use only blobs it uploaded itself.
CREATE TABLE image_blobs (
    workspace_id text NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    digest       text NOT NULL,
    size_bytes   bigint NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workspace_id, digest)
);

-- +goose Down
DROP TABLE image_blobs;
DROP TABLE image_steps;
DROP TABLE images;
