package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/levers9/levers9/controlplane/auth"
	"github.com/levers9/levers9/controlplane/store"
	"github.com/levers9/levers9/enroll"
	"github.com/levers9/levers9/internal/ids"
)

// Factories seed rows with sensible defaults; each fails the test on error.

// newStore is a store on a migrated database of the test's own: tests may
// commit and run concurrently without seeing each other's rows.
func newStore(t *testing.T) *store.Store {
	t.Helper()
	st, _ := env.NewStore(t)
	return st
}

func newWorkspace(t *testing.T, st *store.Store) store.Workspace {
	t.Helper()
	id := ids.New("ws")
	ws := store.Workspace{ID: id, Name: "ws-" + id[3:], CreatedAt: time.Now().UTC().Truncate(time.Microsecond)}
	if err := st.CreateWorkspace(context.Background(), ws); err != nil {
		t.Fatal(err)
	}
	return ws
}

// newToken creates a token in wsID and returns its row and bearer secret.
func newToken(t *testing.T, st *store.Store, wsID string, createdAt time.Time) (store.Token, string) {
	t.Helper()
	id, secret, hash := auth.Mint()
	tok := store.Token{ID: id, WorkspaceID: wsID, Name: "tok", Role: store.RoleMember, Hash: hash, CreatedAt: createdAt}
	if err := st.CreateToken(context.Background(), tok); err != nil {
		t.Fatal(err)
	}
	return tok, secret
}

// newPendingMachine creates a machine in pool with a join token valid for
// an hour and returns the machine and the token.
func newPendingMachine(t *testing.T, st *store.Store, wsID, pool string) (store.Machine, enroll.JoinToken) {
	t.Helper()
	jtID, raw, hash := enroll.MintJoinToken()
	jt, err := enroll.ParseJoinToken(raw)
	if err != nil {
		t.Fatal(err)
	}
	id := ids.New("m")
	m := store.Machine{ID: id, WorkspaceID: wsID, Name: "box-" + id[2:], Pool: pool, CreatedAt: time.Now()}
	if err := st.CreateMachine(context.Background(), m, store.JoinTokenRow{ID: jtID, Hash: hash, ExpiresAt: time.Now().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	return m, jt
}

// issueFor records a fake certificate valid until notAfter.
func issueFor(notAfter time.Time) func(store.Machine) (store.Enrollment, error) {
	return func(m store.Machine) (store.Enrollment, error) {
		return store.Enrollment{Serial: "serial-" + m.ID, NotAfter: notAfter, AgentVersion: "test", Hostname: m.Name}, nil
	}
}

// newMachine creates and enrolls a machine in pool with a certificate valid
// for a day, and records a heartbeat with a small inventory.
func newMachine(t *testing.T, st *store.Store, wsID, pool string) store.Machine {
	t.Helper()
	ctx := context.Background()
	m, jt := newPendingMachine(t, st, wsID, pool)
	if _, err := st.Enroll(ctx, jt.ID, time.Now(), jt.Matches, issueFor(time.Now().Add(24*time.Hour))); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Heartbeat(ctx, m.ID, "quic", "test", []byte(`{"cpus":4}`)); err != nil {
		t.Fatal(err)
	}
	got, err := st.GetMachine(ctx, wsID, m.ID)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// newTask inserts a PENDING task of 100 mCPU and 1 MiB; mutate adjusts it
// first.
func newTask(t *testing.T, st *store.Store, wsID, pool string, mutate func(*store.Task)) store.Task {
	t.Helper()
	tk := store.Task{ID: ids.New("task"), WorkspaceID: wsID, Pool: pool, Spec: []byte(`{}`), CPUMillis: 100, MemoryBytes: 1 << 20,
		CreatedAt: time.Now().UTC().Truncate(time.Microsecond)}
	if mutate != nil {
		mutate(&tk)
	}
	got, existing, err := st.InsertTask(context.Background(), tk)
	if err != nil {
		t.Fatal(err)
	}
	if existing {
		t.Fatalf("task %s: an idempotency key of an earlier task", tk.ID)
	}
	return got
}
