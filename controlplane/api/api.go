// Package api owns the controlplane's public gRPC services (auth, tokens,
// secrets, workspaces): it checks requests, scopes every query to the
// caller's workspace (another workspace's objects are simply not found),
// seals secret values, and maps error kinds to gRPC codes at this edge. It
// never returns a secret value or token hash, and never logs them.
// API: internal to the controlplane.
package api

import (
	"context"
	"fmt"
	"log/slog"
	"regexp"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/levers9/levers9/controlplane/agentdist"
	"github.com/levers9/levers9/controlplane/bus"
	"github.com/levers9/levers9/controlplane/config"
	"github.com/levers9/levers9/controlplane/seal"
	"github.com/levers9/levers9/controlplane/store"
	"github.com/levers9/levers9/controlplane/tasks"
	"github.com/levers9/levers9/internal/clock"
	"github.com/levers9/levers9/internal/errdefs"
)

// Deps is what the services need.
type Deps struct {
	Store   *store.Store
	Keyring *seal.Keyring
	Bus     *bus.Bus
	Log     *slog.Logger
	Config  *config.Config
	// CA returns the agent CA (available once Postgres is ready).
	CA CAProvider
	// Dist hands agent binaries to joining machines.
	Dist *agentdist.Dist
	// Public is how machines reach this controlplane.
	Public PublicEndpoints
	// Presence is the tunnel registry.
	Presence Presence
	// Tasks runs tasks.
	Tasks   *tasks.Manager
	Metrics Metrics
	// BootstrapSecret enables bootstrap when non-empty.
	BootstrapSecret string
	// Clock stamps what the services create (default the wall clock).
	Clock clock.Clock
}

// PublicEndpoints are what join scripts and enrollment tell machines.
type PublicEndpoints struct {
	GRPC   string // HOST:PORT
	REST   string // https://HOST:PORT
	Tunnel string // HOST:PORT
	CAPEM  string // CA for the controlplane's TLS certificate, if private
}

// Metrics are the counters the services bump.
type Metrics interface {
	Enrolled()
	RefusedJoin()
}

var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$`)

func checkName(field, v string) error {
	if !nameRE.MatchString(v) {
		return fmt.Errorf("%s %q: use 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit: %w", field, v, errdefs.ErrInvalidArgument)
	}
	return nil
}

func ts(t *time.Time) *timestamppb.Timestamp {
	if t == nil {
		return nil
	}
	return timestamppb.New(*t)
}

// publish records an event; Redis being down must not fail the RPC whose
// durable effect already happened in Postgres.
func (d *Deps) publish(ctx context.Context, e bus.Event) {
	if d.Bus == nil {
		return
	}
	if err := d.Bus.Publish(ctx, e); err != nil {
		d.Log.Warn("event not published", "kind", e.Kind, "workspace_id", e.Workspace, "err", err)
	}
}

func (d *Deps) now() time.Time { return clock.OrReal(d.Clock).Now().UTC() }
