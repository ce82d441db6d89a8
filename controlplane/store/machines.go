package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/levers9/levers9/enroll"
	"github.com/levers9/levers9/internal/errdefs"
)

// Machine is a row of machines.
type Machine struct {
	ID          string
	WorkspaceID string
	Name        string
	Pool        string
	CreatedAt   time.Time
	EnrolledAt  *time.Time
	DeletedAt   *time.Time
	// CertSerial is the serial of the machine's current certificate, the
	// only one the tunnel admits once the agent has switched to it.
	CertSerial string
	// PrevCertSerial is the certificate a renewal replaced, still admitted
	// until a session presents CertSerial ("" when there is none).
	PrevCertSerial string
	CertNotAfter   *time.Time
	AgentVersion   string
	Hostname       string
	LastHeartbeat  *time.Time
	Transport      string
	// Inventory is the agent's last report, as JSON.
	Inventory []byte
	// JoinExpiresAt is the expiry of the machine's unused join token, if any.
	JoinExpiresAt *time.Time
	// Labels are the machine's labels (machine create --label); never nil
	// once read.
	Labels map[string]string
}

const machineColumns = `m.id, m.workspace_id, m.name, m.pool, m.created_at, m.enrolled_at, m.deleted_at,
	coalesce(m.cert_serial, ''), coalesce(m.prev_cert_serial, ''), m.cert_not_after, m.agent_version, m.hostname, m.last_heartbeat, m.transport, m.inventory,
	(SELECT max(j.expires_at) FROM join_tokens j WHERE j.machine_id = m.id AND j.used_at IS NULL), m.labels`

func scanMachine(row interface{ Scan(...any) error }) (Machine, error) {
	var m Machine
	err := row.Scan(&m.ID, &m.WorkspaceID, &m.Name, &m.Pool, &m.CreatedAt, &m.EnrolledAt, &m.DeletedAt,
		&m.CertSerial, &m.PrevCertSerial, &m.CertNotAfter, &m.AgentVersion, &m.Hostname, &m.LastHeartbeat, &m.Transport, &m.Inventory, &m.JoinExpiresAt, &m.Labels)
	if m.Labels == nil {
		m.Labels = map[string]string{}
	}
	return m, err
}

// JoinTokenRow is a row of join_tokens.
type JoinTokenRow struct {
	ID        string
	MachineID string
	Hash      []byte
	ExpiresAt time.Time
}

// CreateMachine inserts a pending machine and its join token.
func (s *Store) CreateMachine(ctx context.Context, m Machine, jt JoinTokenRow) error {
	return s.tx(ctx, func(tx pgx.Tx) error {
		labels := m.Labels
		if labels == nil {
			labels = map[string]string{}
		}
		_, err := tx.Exec(ctx, `INSERT INTO machines (id, workspace_id, name, pool, created_at, labels) VALUES ($1, $2, $3, $4, $5, $6)`,
			m.ID, m.WorkspaceID, m.Name, m.Pool, m.CreatedAt, labels)
		if err != nil {
			return wrap("create machine "+m.Name, err)
		}
		_, err = tx.Exec(ctx, `INSERT INTO join_tokens (id, machine_id, hash, expires_at) VALUES ($1, $2, $3, $4)`,
			jt.ID, m.ID, jt.Hash, jt.ExpiresAt)
		return wrap("create join token for "+m.ID, err)
	})
}

// ListMachines lists a workspace's machines that are not deleted, by name;
// pool filters when not empty.
func (s *Store) ListMachines(ctx context.Context, wsID, pool string) ([]Machine, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+machineColumns+` FROM machines m
		WHERE m.workspace_id = $1 AND m.deleted_at IS NULL AND ($2 = '' OR m.pool = $2) ORDER BY m.name, m.id`, wsID, pool)
	if err != nil {
		return nil, wrap("list machines", err)
	}
	defer rows.Close()
	var out []Machine
	for rows.Next() {
		m, err := scanMachine(rows)
		if err != nil {
			return nil, wrap("list machines", err)
		}
		out = append(out, m)
	}
	return out, wrap("list machines", rows.Err())
}

// GetMachine returns a machine of the workspace (deleted ones are not found).
func (s *Store) GetMachine(ctx context.Context, wsID, id string) (Machine, error) {
	m, err := scanMachine(s.pool.QueryRow(ctx, `SELECT `+machineColumns+` FROM machines m
		WHERE m.id = $1 AND m.workspace_id = $2 AND m.deleted_at IS NULL`, id, wsID))
	return m, wrap("machine "+id, err)
}

// MachineByID returns any machine, deleted or not, for credential checks.
func (s *Store) MachineByID(ctx context.Context, id string) (Machine, error) {
	m, err := scanMachine(s.pool.QueryRow(ctx, `SELECT `+machineColumns+` FROM machines m WHERE m.id = $1`, id))
	return m, wrap("machine "+id, err)
}

// DeleteMachine marks a machine deleted and returns it.
func (s *Store) DeleteMachine(ctx context.Context, wsID, id string) (Machine, error) {
	var deleted string
	err := s.pool.QueryRow(ctx, `UPDATE machines SET deleted_at = now()
		WHERE id = $1 AND workspace_id = $2 AND deleted_at IS NULL RETURNING id`, id, wsID).Scan(&deleted)
	if err != nil {
		return Machine{}, wrap("delete machine "+id, err)
	}
	return s.MachineByID(ctx, id)
}

// ErrJoinRefused is the kind of every refused join token; the message says
// why (used, expired, machine deleted, pool gone).
var ErrJoinRefused = errdefs.ErrPermissionDenied

// Enrollment is what Enroll records.
type Enrollment struct {
	Serial       string
	NotAfter     time.Time
	AgentVersion string
	Hostname     string
}

// Enroll consumes join token tokenID (single use) in one transaction: it
// checks the hash with match, that the token is unused and unexpired at now
// (the caller's clock, the one that set the expiry) and the machine not
// deleted, calls issue to sign the certificate, and records the enrollment.
// Two concurrent uses of one token enroll at most once.
func (s *Store) Enroll(ctx context.Context, tokenID string, now time.Time, match func(hash []byte) bool, issue func(Machine) (Enrollment, error)) (Machine, error) {
	var out Machine
	err := s.tx(ctx, func(tx pgx.Tx) error {
		var (
			hash      []byte
			expiresAt time.Time
			usedAt    *time.Time
			machineID string
		)
		err := tx.QueryRow(ctx, `SELECT hash, expires_at, used_at, machine_id FROM join_tokens WHERE id = $1 FOR UPDATE`, tokenID).
			Scan(&hash, &expiresAt, &usedAt, &machineID)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("join token %s is not known: %w", tokenID, ErrJoinRefused)
		}
		if err != nil {
			return wrap("read join token", err)
		}
		if !match(hash) {
			return fmt.Errorf("join token %s is forged: %w", tokenID, ErrJoinRefused)
		}
		if usedAt != nil {
			return fmt.Errorf("join token %s was already used at %s: create a new one with `levers9 machine create`: %w", tokenID, usedAt.UTC().Format(time.RFC3339), ErrJoinRefused)
		}
		if now.After(expiresAt) {
			return fmt.Errorf("join token %s expired at %s: create a new one with `levers9 machine create`: %w", tokenID, expiresAt.UTC().Format(time.RFC3339), ErrJoinRefused)
		}
		m, err := scanMachine(tx.QueryRow(ctx, `SELECT `+machineColumns+` FROM machines m WHERE m.id = $1 FOR UPDATE`, machineID))
		if err != nil {
			return wrap("read machine "+machineID, err)
		}
		if m.DeletedAt != nil {
			return fmt.Errorf("machine %s was deleted: %w", m.ID, ErrJoinRefused)
		}
		e, err := issue(m)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `UPDATE join_tokens SET used_at = now() WHERE id = $1`, tokenID); err != nil {
			return wrap("consume join token", err)
		}
		out, err = scanMachine(tx.QueryRow(ctx, `UPDATE machines m SET enrolled_at = coalesce(enrolled_at, now()), cert_serial = $2, prev_cert_serial = NULL,
			cert_not_after = $3, agent_version = $4, hostname = $5 WHERE id = $1 RETURNING `+machineColumns,
			m.ID, e.Serial, e.NotAfter, e.AgentVersion, e.Hostname))
		return wrap("record enrollment of "+m.ID, err)
	})
	return out, err
}

// RenewCertificate records a machine's new certificate, issued to a session
// that presented the certificate with serial presented, in one statement:
// serial becomes the current certificate and presented the previous one
// (admitted until the agent reconnects with the new one, see
// RetireCertificate); any other certificate stops working at once. A
// presented serial that is neither the current nor the previous one is
// refused (PermissionDenied); a deleted or unknown machine is NotFound.
func (s *Store) RenewCertificate(ctx context.Context, machineID, presented, serial string, notAfter time.Time) error {
	tag, err := s.pool.Exec(ctx, `UPDATE machines SET cert_serial = $3, prev_cert_serial = $2, cert_not_after = $4
		WHERE id = $1 AND deleted_at IS NULL AND $2 <> '' AND (cert_serial = $2 OR prev_cert_serial = $2)`,
		machineID, presented, serial, notAfter)
	if err != nil {
		return wrap("renew certificate of "+machineID, err)
	}
	if tag.RowsAffected() == 1 {
		return nil
	}
	m, err := s.MachineByID(ctx, machineID)
	if err != nil {
		return err
	}
	if m.DeletedAt != nil {
		return fmt.Errorf("machine %s: %w", machineID, errdefs.ErrNotFound)
	}
	return fmt.Errorf("machine %s: certificate %s is not the machine's current one: %w", machineID, presented, errdefs.ErrPermissionDenied)
}

// RetireCertificate forgets machineID's previous certificate once a session
// presents serial, the current one; it reports whether there was one to
// forget. It is a no-op when serial is not current.
func (s *Store) RetireCertificate(ctx context.Context, machineID, serial string) (bool, error) {
	tag, err := s.pool.Exec(ctx, `UPDATE machines SET prev_cert_serial = NULL
		WHERE id = $1 AND cert_serial = $2 AND prev_cert_serial IS NOT NULL`, machineID, serial)
	if err != nil {
		return false, wrap("retire previous certificate of "+machineID, err)
	}
	return tag.RowsAffected() == 1, nil
}

// MachineCert is what re-authorizing a tunnel needs of a machine.
type MachineCert struct {
	Deleted        bool
	CertSerial     string
	PrevCertSerial string
}

// MachineCerts returns the certificate state of the machines in ids that
// exist (deleted ones included, marked), in one query.
func (s *Store) MachineCerts(ctx context.Context, ids []string) (map[string]MachineCert, error) {
	rows, err := s.pool.Query(ctx, `SELECT id, deleted_at IS NOT NULL, coalesce(cert_serial, ''), coalesce(prev_cert_serial, '')
		FROM machines WHERE id = ANY($1)`, ids)
	if err != nil {
		return nil, wrap("read machine certificates", err)
	}
	defer rows.Close()
	out := make(map[string]MachineCert, len(ids))
	for rows.Next() {
		var id string
		var c MachineCert
		if err := rows.Scan(&id, &c.Deleted, &c.CertSerial, &c.PrevCertSerial); err != nil {
			return nil, wrap("read machine certificates", err)
		}
		out[id] = c
	}
	return out, wrap("read machine certificates", rows.Err())
}

// Heartbeat records a heartbeat with the agent's inventory as JSON (nil
// keeps the last one) and transport, and returns the certificate's expiry
// so the caller can ask for a renewal without another query.
func (s *Store) Heartbeat(ctx context.Context, machineID, transport, agentVersion string, inventoryJSON []byte) (certNotAfter *time.Time, err error) {
	err = s.pool.QueryRow(ctx, `UPDATE machines SET last_heartbeat = now(), transport = $2,
		agent_version = CASE WHEN $3 = '' THEN agent_version ELSE $3 END,
		inventory = coalesce($4, inventory) WHERE id = $1 AND deleted_at IS NULL RETURNING cert_not_after`,
		machineID, transport, agentVersion, inventoryJSON).Scan(&certNotAfter)
	return certNotAfter, wrap("heartbeat of "+machineID, err)
}

// ClusterAgents lists the enrolled, undeleted agents of attached clusters
// (machines labelled enroll.ClusterAgentLabel) in every workspace and
// pool, by ID.
func (s *Store) ClusterAgents(ctx context.Context) ([]Machine, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+machineColumns+` FROM machines m
		WHERE m.labels ->> $1 = 'true' AND m.enrolled_at IS NOT NULL AND m.deleted_at IS NULL ORDER BY m.id`, enroll.ClusterAgentLabel)
	if err != nil {
		return nil, wrap("list cluster agents", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Machine, error) { return scanMachine(r) })
	return out, wrap("list cluster agents", err)
}
