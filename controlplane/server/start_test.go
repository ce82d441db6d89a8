package server_test

import (
	"context"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/levers9/levers9/controlplane/config"
	"github.com/levers9/levers9/controlplane/server"
)

// A Start that fails part-way closes what it opened (the store's pool, the
// Redis client, the listeners bound so far), and Stop after it neither
// panics nor blocks.
func TestFailedStartClosesWhatItOpened(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	missing := filepath.Join(t.TempDir(), "missing.pem")
	tests := []struct {
		name string
		set  func(*config.Config)
		want string
	}{
		{"REST port taken", func(c *config.Config) { c.Controlplane.RESTAddr = busy.Addr().String() }, "listen for REST"},
		{"gRPC port taken", func(c *config.Config) { c.Controlplane.GRPCAddr = busy.Addr().String() }, "listen for gRPC"},
		{"certificate missing", func(c *config.Config) { c.Controlplane.TLS.CertFile, c.Controlplane.TLS.KeyFile = missing, missing },
			"load controlplane certificate"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := env.Config(t)
			tt.set(cfg)
			defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
			srv, err := server.New(cfg, server.Options{Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			err = srv.Start(context.Background())
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Start: %v, want an error with %q", err, tt.want)
			}
			srv.Stop()
			srv.Stop()
		})
	}
}
