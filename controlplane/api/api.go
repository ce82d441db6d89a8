// Package api owns the controlplane's implementations of the public
// levers9.v1 gRPC services (served also as REST through the gateway): auth
// and bootstrap, workspaces and their storage credentials, tokens, secrets,
// registry logins, pools, machines with their join scripts, enrollment (signing an agent's
// CSR for a join token), tasks, and the pools' security readiness report.
// Each service checks its request (errors name the field), takes the
// caller's workspace from the authenticated principal and scopes every
// query to it (another workspace's objects are simply not found), seals
// secret values and storage credentials with the keyring, records events on
// the bus without failing an RPC whose durable effect is already stored, and
// maps error kinds to gRPC codes here at the edge. Tasks are delegated to
// controlplane/tasks and machine presence to the tunnel registry; this
// package holds no state of its own beyond Deps.
//
// It must never return a secret value, a token or its hash, or a join token
// after creation, never log them, and never serve the agent protocol
// (levers9.agent.v1 lives in controlplane/agents). OpenSecret and
// OpenRegistryLogin are for the controlplane's own use (the latter feeds
// controlplane/tasks at push time) and are never exposed through an RPC.
//
// API stability: the Go API is internal to the controlplane and changes
// with controlplane/server, which registers the services; the wire
// contract is api/levers9/v1's and is stable.
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
	"github.com/levers9/levers9/controlplane/images"
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
	Tasks   *tasks.Service
	Metrics Metrics
	// BootstrapSecret enables bootstrap when non-empty.
	BootstrapSecret string
	// Clock stamps what the services create (default the wall clock).
	Clock clock.Clock
	// Volumes are the volume drivers (nil: volumes are refused).
	Volumes VolumeDrivers
	// Images builds images from recipes.
	Images *images.Service
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
