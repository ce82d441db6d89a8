package api_test

import (
	"context"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/levers9/levers9/controlplane/api"
	"github.com/levers9/levers9/controlplane/auth"
	"github.com/levers9/levers9/controlplane/bus"
	"github.com/levers9/levers9/controlplane/controlplanetest"
	"github.com/levers9/levers9/controlplane/seal"
	"github.com/levers9/levers9/controlplane/store"
	"github.com/levers9/levers9/internal/ids"
)

// env is the Postgres and Redis of this test binary.
var env *controlplanetest.Env

// TestMain starts the services and checks for leaked goroutines after the
// tests (controlplanetest.Main runs goleak).
func TestMain(m *testing.M) { os.Exit(controlplanetest.Main(m, &env)) }

// bundle is the services' dependencies on a database and Redis of the
// test's own, with one workspace and a caller authenticated into it.
type bundle struct {
	deps *api.Deps
	logs *controlplanetest.Logs
	ws   store.Workspace
	// ctx carries the caller (as the auth interceptor leaves it).
	ctx context.Context
}

func setup(t *testing.T) *bundle {
	t.Helper()
	st, _ := env.NewStore(t)
	// 32 random bytes in hex: HKDF, no salt (and no scrypt cost per test).
	kr, err := seal.NewKeyring(nil, "a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f90")
	if err != nil {
		t.Fatal(err)
	}
	logs := &controlplanetest.Logs{}
	b := &bundle{logs: logs, deps: &api.Deps{Store: st, Keyring: kr, Bus: env.NewBus(t), Log: slog.New(slog.NewJSONHandler(logs, nil))}}
	b.ws = store.Workspace{ID: ids.New("ws"), Name: "api-test", CreatedAt: time.Now()}
	if err := st.CreateWorkspace(context.Background(), b.ws); err != nil {
		t.Fatal(err)
	}
	b.ctx = auth.WithPrincipal(context.Background(), auth.Principal{WorkspaceID: b.ws.ID, TokenID: "tok_caller"})
	return b
}

// events lists the kinds of the workspace events published so far, and
// fails if any field of one holds a string of secrets.
func (b *bundle) events(t *testing.T, secrets ...string) []string {
	t.Helper()
	msgs, err := b.deps.Bus.Redis().XRange(context.Background(), bus.EventStream, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, m := range msgs {
		for k, v := range m.Values {
			for _, s := range secrets {
				if strings.Contains(v.(string), s) {
					t.Errorf("event field %s holds a secret", k)
				}
			}
		}
		kinds = append(kinds, m.Values["kind"].(string))
	}
	return kinds
}

// noSecrets fails if any of the messages' encodings or the logs hold one of
// secrets.
func (b *bundle) noSecrets(t *testing.T, msgs []proto.Message, secrets ...string) {
	t.Helper()
	for _, m := range msgs {
		enc, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range secrets {
			if strings.Contains(string(enc), s) {
				t.Errorf("%T carries a secret", m)
			}
		}
	}
	for _, s := range secrets {
		if strings.Contains(b.logs.String(), s) {
			t.Error("a secret reached the logs")
		}
	}
}

func wantCode(t *testing.T, what string, err error, code codes.Code) {
	t.Helper()
	if got := status.Code(err); got != code {
		t.Errorf("%s: code %v (%v), want %v", what, got, err, code)
	}
}
