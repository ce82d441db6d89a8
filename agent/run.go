package agent

import (
	"context"
	"flag"
	"fmt"
	"io"
)

func runCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	stateDir := fs.String("state-dir", "/var/lib/levers9-agent", "the agent's state directory (from join)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	st, err := State{Dir: *stateDir}.Settings()
	if err != nil {
		return err
	}
	return fmt.Errorf("machine %s: the tunnel client is not wired into this build yet", st.MachineID)
}
