package store_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/levers9/levers9/controlplane/store"
	"github.com/levers9/levers9/internal/errdefs"
	"github.com/levers9/levers9/internal/ids"
)

func TestMachineLifecycle(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := newStore(t)
	ws, other := newWorkspace(t, st), newWorkspace(t, st)

	m, jt := newPendingMachine(t, st, ws.ID, "default")
	got, err := st.GetMachine(ctx, ws.ID, m.ID)
	if err != nil || got.EnrolledAt != nil || got.JoinExpiresAt == nil || got.Pool != "default" {
		t.Fatalf("pending machine = %+v, %v", got, err)
	}
	notAfter := time.Now().Add(24 * time.Hour).UTC().Truncate(time.Microsecond)
	enrolled, err := st.Enroll(ctx, jt.ID, time.Now(), jt.Matches, issueFor(notAfter))
	if err != nil {
		t.Fatal(err)
	}
	if enrolled.EnrolledAt == nil || enrolled.CertSerial != "serial-"+m.ID || !enrolled.CertNotAfter.Equal(notAfter) ||
		enrolled.AgentVersion != "test" || enrolled.Hostname != m.Name || enrolled.JoinExpiresAt != nil {
		t.Errorf("enrolled machine = %+v", enrolled)
	}

	t.Run("heartbeat", func(t *testing.T) {
		na, err := st.Heartbeat(ctx, m.ID, "quic", "v2", []byte(`{"cpus": 8}`))
		if err != nil || na == nil || !na.Equal(notAfter) {
			t.Fatalf("Heartbeat = %v, %v; want the certificate's expiry %v", na, err, notAfter)
		}
		// An empty version and a nil inventory keep the last ones.
		if _, err := st.Heartbeat(ctx, m.ID, "tcp", "", nil); err != nil {
			t.Fatal(err)
		}
		got, err := st.GetMachine(ctx, ws.ID, m.ID)
		if err != nil || got.LastHeartbeat == nil || got.Transport != "tcp" || got.AgentVersion != "v2" || !strings.Contains(string(got.Inventory), `"cpus": 8`) {
			t.Errorf("after heartbeats: %+v, %v", got, err)
		}
		if _, err := st.Heartbeat(ctx, "m_nope", "tcp", "", nil); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("heartbeat of an unknown machine: %v", err)
		}
	})
	t.Run("renew certificate", func(t *testing.T) {
		first := "serial-" + m.ID
		later := notAfter.Add(time.Hour)
		if err := st.RenewCertificate(ctx, m.ID, "serial-forged", "serial-x", later); !errors.Is(err, errdefs.ErrPermissionDenied) {
			t.Errorf("renewal presenting a certificate that is not the machine's: %v, want permission denied", err)
		}
		if err := st.RenewCertificate(ctx, m.ID, first, "serial-2", later); err != nil {
			t.Fatal(err)
		}
		got, err := st.MachineByID(ctx, m.ID)
		if err != nil || got.CertSerial != "serial-2" || got.PrevCertSerial != first || !got.CertNotAfter.Equal(later) {
			t.Errorf("after renewal: %+v, %v", got, err)
		}
		// The agent lost the answer and renews again with its old
		// certificate: the one it holds stays the previous one.
		if err := st.RenewCertificate(ctx, m.ID, first, "serial-3", later); err != nil {
			t.Fatal(err)
		}
		if got, _ := st.MachineByID(ctx, m.ID); got.CertSerial != "serial-3" || got.PrevCertSerial != first {
			t.Errorf("after a second renewal from the old certificate: %+v", got)
		}
		if retired, err := st.RetireCertificate(ctx, m.ID, first); retired || err != nil {
			t.Errorf("the old certificate retired the previous one: %v, %v", retired, err)
		}
		if retired, err := st.RetireCertificate(ctx, m.ID, "serial-3"); !retired || err != nil {
			t.Errorf("RetireCertificate with the current serial = %v, %v", retired, err)
		}
		if retired, err := st.RetireCertificate(ctx, m.ID, "serial-3"); retired || err != nil {
			t.Errorf("RetireCertificate twice = %v, %v", retired, err)
		}
		if err := st.RenewCertificate(ctx, m.ID, first, "serial-4", later); !errors.Is(err, errdefs.ErrPermissionDenied) {
			t.Errorf("renewal from a retired certificate: %v, want permission denied", err)
		}
		certs, err := st.MachineCerts(ctx, []string{m.ID, "m_nope"})
		if err != nil || len(certs) != 1 || certs[m.ID] != (store.MachineCert{CertSerial: "serial-3"}) {
			t.Errorf("MachineCerts = %+v, %v", certs, err)
		}
	})
	t.Run("list", func(t *testing.T) {
		newPendingMachine(t, st, ws.ID, "gpu")
		newPendingMachine(t, st, other.ID, "default")
		for _, tc := range []struct {
			pool string
			want int
		}{{"", 2}, {"default", 1}, {"gpu", 1}, {"nope", 0}} {
			list, err := st.ListMachines(ctx, ws.ID, tc.pool)
			if err != nil || len(list) != tc.want {
				t.Errorf("ListMachines(pool %q) = %d machines (%v), want %d", tc.pool, len(list), err, tc.want)
			}
		}
		if _, err := st.GetMachine(ctx, other.ID, m.ID); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("another workspace gets the machine: %v", err)
		}
	})
	t.Run("delete", func(t *testing.T) {
		if _, err := st.DeleteMachine(ctx, other.ID, m.ID); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("another workspace deletes the machine: %v", err)
		}
		deleted, err := st.DeleteMachine(ctx, ws.ID, m.ID)
		if err != nil || deleted.DeletedAt == nil {
			t.Fatalf("DeleteMachine = %+v, %v", deleted, err)
		}
		for _, tc := range []struct {
			name string
			err  error
		}{
			{"delete again", func() error { _, err := st.DeleteMachine(ctx, ws.ID, m.ID); return err }()},
			{"get", func() error { _, err := st.GetMachine(ctx, ws.ID, m.ID); return err }()},
			{"heartbeat", func() error { _, err := st.Heartbeat(ctx, m.ID, "tcp", "", nil); return err }()},
			{"renew", st.RenewCertificate(ctx, m.ID, "serial-3", "serial-5", notAfter)},
		} {
			if !errors.Is(tc.err, errdefs.ErrNotFound) {
				t.Errorf("%s after delete: %v, want not found", tc.name, tc.err)
			}
		}
		// Credential checks still see it, deleted.
		if certs, err := st.MachineCerts(ctx, []string{m.ID}); err != nil || !certs[m.ID].Deleted {
			t.Errorf("MachineCerts after delete = %+v, %v", certs, err)
		}
		if got, err := st.MachineByID(ctx, m.ID); err != nil || got.DeletedAt == nil {
			t.Errorf("MachineByID after delete = %+v, %v", got, err)
		}
		// Its name is free again.
		if err := st.CreateMachine(ctx, store.Machine{ID: "m_again", WorkspaceID: ws.ID, Name: m.Name, Pool: "default", CreatedAt: time.Now()},
			store.JoinTokenRow{ID: "jt_again", Hash: []byte{1}, ExpiresAt: time.Now().Add(time.Hour)}); err != nil {
			t.Errorf("reuse a deleted machine's name: %v", err)
		}
	})
}

func TestEnrollRefusals(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := newStore(t)
	ws := newWorkspace(t, st)
	notAfter := time.Now().Add(time.Hour)
	never := func(hash []byte) bool { return false }

	for _, tc := range []struct {
		name string
		// prepare returns the token ID and matcher to enroll with.
		prepare func(t *testing.T) (string, func([]byte) bool)
		issue   func(store.Machine) (store.Enrollment, error)
		want    string
	}{
		{"unknown token", func(t *testing.T) (string, func([]byte) bool) { return "jt_nope", never }, nil, "not known"},
		{"forged token", func(t *testing.T) (string, func([]byte) bool) {
			_, jt := newPendingMachine(t, st, ws.ID, "default")
			return jt.ID, never
		}, nil, "forged"},
		{"used token", func(t *testing.T) (string, func([]byte) bool) {
			_, jt := newPendingMachine(t, st, ws.ID, "default")
			if _, err := st.Enroll(ctx, jt.ID, time.Now(), jt.Matches, issueFor(notAfter)); err != nil {
				t.Fatal(err)
			}
			return jt.ID, jt.Matches
		}, nil, "already used"},
		{"expired token", func(t *testing.T) (string, func([]byte) bool) {
			jt := ids.New("jt")
			if err := st.CreateMachine(ctx, store.Machine{ID: ids.New("m"), WorkspaceID: ws.ID, Name: jt, Pool: "default", CreatedAt: time.Now()},
				store.JoinTokenRow{ID: jt, Hash: []byte{1}, ExpiresAt: time.Now().Add(-time.Second)}); err != nil {
				t.Fatal(err)
			}
			return jt, func([]byte) bool { return true }
		}, nil, "expired"},
		{"deleted machine", func(t *testing.T) (string, func([]byte) bool) {
			m, jt := newPendingMachine(t, st, ws.ID, "default")
			if _, err := st.DeleteMachine(ctx, ws.ID, m.ID); err != nil {
				t.Fatal(err)
			}
			return jt.ID, jt.Matches
		}, nil, "deleted"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id, match := tc.prepare(t)
			issue := tc.issue
			if issue == nil {
				issue = issueFor(notAfter)
			}
			_, err := st.Enroll(ctx, id, time.Now(), match, issue)
			if !errors.Is(err, store.ErrJoinRefused) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Enroll = %v, want a refusal saying %q", err, tc.want)
			}
		})
	}

	t.Run("a failed issue leaves the token unused", func(t *testing.T) {
		m, jt := newPendingMachine(t, st, ws.ID, "default")
		boom := errors.New("CA unavailable")
		if _, err := st.Enroll(ctx, jt.ID, time.Now(), jt.Matches, func(store.Machine) (store.Enrollment, error) { return store.Enrollment{}, boom }); !errors.Is(err, boom) {
			t.Fatalf("Enroll with a failing issue: %v", err)
		}
		if got, err := st.Enroll(ctx, jt.ID, time.Now(), jt.Matches, issueFor(notAfter)); err != nil || got.ID != m.ID {
			t.Errorf("retry after a failed issue = %+v, %v", got, err)
		}
	})
	t.Run("concurrent uses enroll once", func(t *testing.T) {
		_, jt := newPendingMachine(t, st, ws.ID, "default")
		var wg sync.WaitGroup
		var ok, issued atomic.Int32
		for range 6 {
			wg.Go(func() {
				_, err := st.Enroll(ctx, jt.ID, time.Now(), jt.Matches, func(m store.Machine) (store.Enrollment, error) {
					issued.Add(1)
					return issueFor(notAfter)(m)
				})
				if err == nil {
					ok.Add(1)
				} else if !errors.Is(err, store.ErrJoinRefused) {
					t.Errorf("losing enrollment: %v", err)
				}
			})
		}
		wg.Wait()
		if ok.Load() != 1 || issued.Load() != 1 {
			t.Errorf("%d enrollments and %d certificates from one token, want 1 and 1", ok.Load(), issued.Load())
		}
	})
}

func TestAgentCA(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := newStore(t)
	var created atomic.Int32
	create := func() (store.CARow, error) {
		created.Add(1)
		return store.CARow{CertPEM: "cert-1", Key: store.Sealed{KeyID: "k", Bytes: []byte("sealed")}}, nil
	}

	boom := errors.New("no entropy")
	if _, err := st.GetOrCreateCA(ctx, "agents", func() (store.CARow, error) { return store.CARow{}, boom }); !errors.Is(err, boom) {
		t.Fatalf("a failing create: %v", err)
	}
	// Replicas starting together create exactly one CA.
	var wg sync.WaitGroup
	rows := make(chan store.CARow, 6)
	for range 6 {
		wg.Go(func() {
			row, err := st.GetOrCreateCA(ctx, "agents", create)
			if err != nil {
				t.Error(err)
			}
			rows <- row
		})
	}
	wg.Wait()
	close(rows)
	if created.Load() != 1 {
		t.Errorf("the CA was created %d times, want once", created.Load())
	}
	for row := range rows {
		if row.CertPEM != "cert-1" || row.Key.KeyID != "k" || string(row.Key.Bytes) != "sealed" {
			t.Errorf("GetOrCreateCA = %+v", row)
		}
	}
}
