package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/levers9/levers9/internal/clientconfig"
	"github.com/levers9/levers9/internal/version"
)

// versionAskTimeout caps how long `levers9 version` waits for the
// controlplane: the client's own version is the answer that matters, so a
// silent address must not hold it for the whole --timeout.
const versionAskTimeout = 5 * time.Second

// versionReport is `levers9 version -o json`.
type versionReport struct {
	Client       version.BuildInfo `json:"client"`
	Controlplane *serverVersion    `json:"controlplane,omitempty"`
}

type serverVersion struct {
	Address string `json:"address,omitempty"`
	Version string `json:"version,omitempty"`
	// Serving is the health check's answer: false while the controlplane
	// waits for Postgres, Redis or its migrations.
	Serving bool `json:"serving"`
	// Error says why the version is missing: no context, unreachable, or a
	// controlplane too old to report one.
	Error string `json:"error,omitempty"`
}

// versionCmd prints the CLI's version and, when a context is configured,
// the controlplane's, read from the header of a health check (which needs
// no token). It never prompts for a first config, and it exits 0 whenever
// the client's own version was printed: an unreachable controlplane is a
// line of the report, not a failure, so scripts can always read the
// client's version.
func (a *app) versionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the CLI's version and commit, and the controlplane's when one is configured",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			r := versionReport{Client: version.Info(), Controlplane: a.serverVersion()}
			if a.output == "json" {
				enc := json.NewEncoder(a.io.Out)
				enc.SetIndent("", "  ")
				return enc.Encode(r)
			}
			fmt.Fprintln(a.io.Out, "levers9:", r.Client.String())
			sv := r.Controlplane
			switch {
			case sv.Error != "":
				fmt.Fprintf(a.io.Out, "controlplane: %s\n", sv.Error)
			case !sv.Serving:
				fmt.Fprintf(a.io.Out, "controlplane: %s at %s, not serving yet (waiting for Postgres, Redis or migrations)\n", sv.Version, sv.Address)
			default:
				fmt.Fprintf(a.io.Out, "controlplane: %s at %s\n", sv.Version, sv.Address)
			}
			return nil
		},
	}
}

// serverVersion asks the active context's controlplane for its version.
func (a *app) serverVersion() *serverVersion {
	c, _, err := clientconfig.Resolve(a.getenv, a.context)
	if errors.Is(err, ErrNoConfig) {
		return &serverVersion{Error: "no context configured (`levers9 config create` or LEVERS9_CONTROLPLANE)"}
	}
	if err != nil {
		return &serverVersion{Error: fmt.Sprintf("unknown (%v)", err)}
	}
	sv := &serverVersion{Address: c.Controlplane}
	useTLS, err := UseTLS(c.Controlplane, c.TLS, a.getenv)
	if err != nil {
		sv.Error = fmt.Sprintf("unreachable (%v)", err)
		return sv
	}
	conn, err := Dial(c, a.getenv)
	if err != nil {
		sv.Error = fmt.Sprintf("unreachable (%s: %v)", c.Controlplane, err)
		return sv
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), min(a.timeout, versionAskTimeout))
	defer cancel()
	var md metadata.MD
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&md))
	if v := md.Get(version.Header); len(v) > 0 {
		sv.Version = v[0]
	}
	if err != nil {
		msg := err.Error()
		if st, ok := status.FromError(err); ok {
			msg = st.Message()
		}
		// One line: the transport advice is long but says what to fix.
		msg = strings.ReplaceAll(explainTransport(errors.New(msg), c, useTLS).Error(), "\n", " ")
		sv.Error = fmt.Sprintf("unreachable (%s: %s)", c.Controlplane, msg)
		return sv
	}
	sv.Serving = resp.GetStatus() == healthpb.HealthCheckResponse_SERVING
	if sv.Version == "" {
		sv.Error = fmt.Sprintf("reachable at %s but reports no version (older than this CLI)", c.Controlplane)
	}
	return sv
}
