package server_test

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/controlplane/config"
	"github.com/levers9/levers9/controlplane/controlplanetest"
	"github.com/levers9/levers9/internal/devstack"
)

func healthStatus(t *testing.T, in *controlplanetest.Instance) healthpb.HealthCheckResponse_ServingStatus {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	resp, err := healthpb.NewHealthClient(in.Conn).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		return healthpb.HealthCheckResponse_UNKNOWN
	}
	return resp.Status
}

func restHealth(t *testing.T, in *controlplanetest.Instance) int {
	resp, err := http.Get("http://" + in.Server.RESTAddr() + "/healthz")
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// privatePostgres starts a Postgres of the test's own (stopped in
// t.Cleanup) with database db, and returns it with a controlplane config
// pointing at it.
func privatePostgres(t *testing.T, db string) (*devstack.Postgres, *config.Config) {
	t.Helper()
	ctx := context.Background()
	dir, err := os.MkdirTemp(env.Dir, db+"-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o755)
	pg, err := devstack.StartPostgres(ctx, filepath.Join(dir, "pg"), devstack.PostgresOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pg.Stop() })
	if err := pg.CreateDatabase(ctx, db); err != nil {
		t.Fatal(err)
	}
	cfg := env.Config(t)
	p := &cfg.Database.Postgres
	p.Host, p.Port, p.User, p.Password, p.Database = pg.Host, pg.Port, pg.User, pg.Password, db
	return pg, cfg
}

// TestPostgresOutage stops a private Postgres under a running controlplane
// and starts it again.
func TestPostgresOutage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg, cfg := privatePostgres(t, "outage")

	in := controlplanetest.Start(t, cfg, true)
	a := bootstrap(t, in.Conn, "test-bootstrap-secret-0123456789abcdef")
	tokens := v1.NewTokenServiceClient(in.Conn)
	actx := withToken(ctx, a.Token)
	if healthStatus(t, in) != healthpb.HealthCheckResponse_SERVING || restHealth(t, in) != http.StatusOK {
		t.Fatal("not healthy before the outage")
	}

	if err := pg.StopServer(ctx); err != nil {
		t.Fatal(err)
	}
	controlplanetest.Eventually(t, 10*time.Second, "unhealthy while postgres is down", func() bool {
		return healthStatus(t, in) == healthpb.HealthCheckResponse_NOT_SERVING && restHealth(t, in) == http.StatusServiceUnavailable
	})
	rctx, cancel := context.WithTimeout(actx, 5*time.Second)
	_, err := tokens.ListTokens(rctx, &v1.ListTokensRequest{})
	cancel()
	wantCode(t, "RPC during the outage", err, codes.Unavailable)
	if len(in.Logs.Find("postgres is down")) == 0 {
		t.Error("no log line for the outage")
	}

	if err := pg.StartServer(ctx); err != nil {
		t.Fatal(err)
	}
	controlplanetest.Eventually(t, 20*time.Second, "healthy after postgres returns", func() bool {
		return healthStatus(t, in) == healthpb.HealthCheckResponse_SERVING && restHealth(t, in) == http.StatusOK
	})
	controlplanetest.Eventually(t, 10*time.Second, "RPCs work again", func() bool {
		_, err := tokens.ListTokens(actx, &v1.ListTokensRequest{})
		return err == nil
	})
}

// TestStartsBeforePostgres starts the controlplane while Postgres is down:
// it serves health (not serving), answers RPCs Unavailable, and migrates
// once Postgres comes up.
func TestStartsBeforePostgres(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg, cfg := privatePostgres(t, "late")
	if err := pg.StopServer(ctx); err != nil {
		t.Fatal(err)
	}
	in := controlplanetest.Start(t, cfg, false)
	_, err := v1.NewAuthServiceClient(in.Conn).Authorize(withBootstrap(ctx, "test-bootstrap-secret-0123456789abcdef"), &v1.AuthorizeRequest{})
	wantCode(t, "bootstrap before postgres", err, codes.Unavailable)
	if healthStatus(t, in) == healthpb.HealthCheckResponse_SERVING {
		t.Error("healthy without postgres")
	}
	if err := pg.StartServer(ctx); err != nil {
		t.Fatal(err)
	}
	controlplanetest.Eventually(t, 20*time.Second, "healthy once postgres is up", in.Server.Healthy)
	bootstrap(t, in.Conn, "test-bootstrap-secret-0123456789abcdef")
}
