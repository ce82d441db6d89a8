package api

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"

	"github.com/levers9/levers9/internal/version"
)

// Main runs the API until ctx ends: flags (only --version and
// --log-level; everything else is environment, see Config), config, start,
// wait, stop.
func Main(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("levers9-dashboard-api", flag.ContinueOnError)
	fs.SetOutput(stderr)
	showVersion := fs.Bool("version", false, "print the version and exit")
	level := fs.String("log-level", "info", "debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *showVersion {
		fmt.Fprintln(stdout, "levers9-dashboard-api", version.String())
		return nil
	}
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(*level)); err != nil {
		return fmt.Errorf("--log-level %q: %w", *level, err)
	}
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: lvl}))
	cfg, err := ConfigFromEnv(getenv)
	if err != nil {
		return fmt.Errorf("configuration:\n%w", err)
	}
	srv, err := New(cfg, Options{Logger: log, Getenv: getenv})
	if err != nil {
		return err
	}
	if err := srv.Start(ctx); err != nil {
		srv.Stop()
		return err
	}
	<-ctx.Done()
	log.Info("dashboard API stopping")
	srv.Stop()
	return nil
}
