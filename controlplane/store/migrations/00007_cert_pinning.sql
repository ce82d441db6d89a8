-- +goose Up
-- Agent certificates are pinned: the tunnel admits a machine only with the
-- certificate whose serial is cert_serial. RenewCertificate moves the
-- serial the renewing session presented into prev_cert_serial, so the agent
-- keeps working on its old certificate until it reconnects with the new
-- one; the first session that presents cert_serial clears it
-- (RetireCertificate), and from then on the old certificate is refused.
ALTER TABLE machines ADD COLUMN prev_cert_serial text;

-- +goose Down
ALTER TABLE machines DROP COLUMN prev_cert_serial;
