// Command levers9-agent is the node agent: it joins a controlplane and runs
// tasks on this machine, or (`levers9-agent cluster`) is the agent of an
// attached Kubernetes cluster.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/levers9/levers9/agent"
	"github.com/levers9/levers9/agent/clusteragent"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	run := agent.Main
	if len(os.Args) > 1 && os.Args[1] == "cluster" {
		// Here, not in agent.Main, so the machine agent's packages never
		// import client-go.
		run = func(ctx context.Context, args []string, stdout, stderr io.Writer) error {
			return clusteragent.Main(ctx, args[1:], stdout, stderr)
		}
	}
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "levers9-agent:", err)
		os.Exit(1)
	}
}
