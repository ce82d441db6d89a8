package server

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime/debug"
	"strings"

	"github.com/levers9/levers9/controlplane/config"
	"github.com/levers9/levers9/internal/version"
)

// Main runs the controlplane until ctx ends: it parses args, loads the
// config (file plus LEVERS9_* from getenv), starts and waits. With the
// seaweedfs-credentials subcommand it only copies credentials and returns.
func Main(ctx context.Context, args []string, getenv func(string) (string, bool), stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == SeaweedFSCredentialsCommand {
		return seaweedFSCredentials(args[1:], stdout, stderr)
	}
	fs := flag.NewFlagSet("levers9-controlplane", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfgPath := fs.String("config", "", "path to the YAML config (keys: controlplane.*, database.*, worker.*); LEVERS9_* variables override it")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: levers9-controlplane [--config FILE] [--version]\n       levers9-controlplane %s --from DIR --to DIR\n\nRuns a levers9 controlplane replica: gRPC (default :1993), REST and health (:1994), /metrics (127.0.0.1:1996).\n\n", SeaweedFSCredentialsCommand)
		fs.PrintDefaults()
	}
	showVersion := fs.Bool("version", false, "print the version and commit, and exit")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *showVersion {
		fmt.Fprintln(stdout, "levers9-controlplane", version.String())
		return nil
	}
	if *cfgPath == "" {
		if v, ok := getenv("LEVERS9_CONFIG"); ok {
			*cfgPath = v
		}
	}
	cfg, err := config.LoadFile(*cfgPath, getenv)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: parseLevel(cfg.Controlplane.LogLevel)}))
	log.Info("starting", "version", version.String())
	switch limit, source, err := memoryLimit(getenv, os.ReadFile); {
	case err != nil:
		log.Warn("no Go memory limit: the memory cgroup's limit could not be read (set GOMEMLIMIT)", "err", err)
	case limit > 0:
		debug.SetMemoryLimit(limit)
		log.Info("Go memory limit from the memory cgroup", "bytes", limit, "share", memLimitShare, "from", source)
	case source != "":
		log.Info("Go memory limit from GOMEMLIMIT", "bytes", debug.SetMemoryLimit(-1))
	default:
		log.Info("no Go memory limit: the memory cgroup has none (GOMEMLIMIT sets one)")
	}
	srv, err := New(cfg, Options{Logger: log})
	if err != nil {
		return err
	}
	if err := srv.Start(ctx); err != nil {
		return err
	}
	<-ctx.Done()
	log.Info("shutting down")
	srv.Stop()
	return nil
}

func parseLevel(s string) slog.Level {
	switch strings.ToLower(s) {
	case "debug":
		return slog.LevelDebug
	case "warn":
		return slog.LevelWarn
	case "error":
		return slog.LevelError
	}
	return slog.LevelInfo
}
