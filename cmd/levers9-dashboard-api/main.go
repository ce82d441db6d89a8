// Command levers9-dashboard-api serves the dashboard's REST and WebSocket
// API (see dashboard/api/API.md); its settings come from LEVERS9_DASHBOARD_*
// environment variables.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/levers9/levers9/dashboard/api"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := api.Main(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "levers9-dashboard-api:", err)
		os.Exit(1)
	}
}
