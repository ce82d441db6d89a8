package agent

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/levers9/levers9/internal/version"
)

// reportedVersion is what the agent tells the controlplane at enroll and
// in every heartbeat (shown by `machine list`): the stamped version line,
// cut to the 64 bytes enroll accepts so an unusually long tag cannot keep
// a machine from joining.
func reportedVersion() string {
	v := version.String()
	if len(v) > 64 {
		v = v[:64]
	}
	return v
}

// Main runs the levers9-agent command line.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		usage(stderr)
		return fmt.Errorf("missing command")
	}
	switch args[0] {
	case "join":
		return joinCmd(ctx, args[1:], stdout, stderr)
	case "run":
		return runCmd(ctx, args[1:], stdout, stderr)
	case "version", "--version", "-version":
		fmt.Fprintln(stdout, "levers9-agent", version.String())
		return nil
	case "-h", "--help", "help":
		usage(stdout)
		return nil
	}
	usage(stderr)
	return fmt.Errorf("unknown command %q", args[0])
}

func usage(w io.Writer) {
	fmt.Fprint(w, `Usage: levers9-agent COMMAND [flags]

The levers9 agent runs tasks on this machine for a levers9 controlplane. It dials out to the
controlplane and never listens on a port. A machine joins with the script from
'levers9 machine create --pool NAME'.

Commands:
  join     enroll this machine with a join token (the join script runs this)
  run      connect to the controlplane and run tasks
  version  print the agent's version and commit (also --version)
`)
}

func joinCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("join", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cp := fs.String("controlplane", "", "controlplane gRPC address, HOST:PORT")
	ca := fs.String("ca-file", "", "PEM CA of the controlplane's certificate (empty: the system's)")
	tokenFile := fs.String("token-file", "", "file holding the join token (deleted after a successful join)")
	stateDir := fs.String("state-dir", "/var/lib/levers9-agent", "where the agent keeps its key and certificate")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *cp == "" || *tokenFile == "" {
		return fmt.Errorf("join needs --controlplane and --token-file (the token is never taken on the command line)")
	}
	host, _ := os.Hostname()
	st, err := Join(ctx, JoinOptions{Controlplane: *cp, CAFile: *ca, TokenFile: *tokenFile, State: State{Dir: *stateDir}, Version: reportedVersion(), Hostname: host})
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "joined as machine %s in pool %s\n", st.MachineID, st.Pool)
	return nil
}

// ReportedVersion is the version the agent reports (see reportedVersion),
// for the cluster agent, which runs the same join, session and heartbeat.
func ReportedVersion() string { return reportedVersion() }
