-- +goose Up
-- The install's salt for sealing keys that are passphrases (scrypt, see
-- controlplane/seal). One row, made here once and never changed: a new salt
-- would strand every row sealed under a passphrase key. gen_random_uuid draws
-- from Postgres's strong random source; two of them give 244 random bits.
CREATE TABLE seal_salt (
    id   boolean PRIMARY KEY DEFAULT true CHECK (id),
    salt bytea NOT NULL CHECK (length(salt) >= 16)
);
INSERT INTO seal_salt (salt)
VALUES (decode(replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', ''), 'hex'));

-- +goose Down
DROP TABLE seal_salt;
