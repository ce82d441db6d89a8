package server

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/levers9/levers9/controlplane/seal"
	"github.com/levers9/levers9/internal/errdefs"
)

// dependencyLoop checks Postgres and Redis every interval. The first time
// Postgres answers it applies migrations and re-seals rows; until then RPCs
// that need the store answer Unavailable.
func (s *Server) dependencyLoop(ctx context.Context) {
	t := time.NewTicker(s.opts.DependencyInterval)
	defer t.Stop()
	for {
		s.checkDependencies(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (s *Server) checkDependencies(ctx context.Context) {
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	pgErr := s.store.Ping(pctx)
	cancel()
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	redisErr := s.bus.Ping(rctx)
	cancel()
	if ctx.Err() != nil {
		return
	}

	s.mu.Lock()
	migrated := s.migrated
	s.mu.Unlock()
	if pgErr == nil && !migrated {
		migrated = s.migrateAndReseal(ctx)
	}
	if migrated && s.agents.Load() == nil && s.ca.Load() != nil {
		if err := s.startAgents(ctx); err != nil {
			s.log.Error("the agent tunnel endpoint did not start; will retry", "err", err)
		}
	}

	s.mu.Lock()
	wasPG, wasRedis := s.pgUp, s.redisUp
	s.pgUp, s.redisUp, s.migrated = pgErr == nil, redisErr == nil, migrated
	healthy := s.migrated && s.pgUp && s.redisUp
	s.mu.Unlock()

	logChange(s, "postgres", wasPG, pgErr)
	logChange(s, "redis", wasRedis, redisErr)
	s.metrics.setUp("postgres", pgErr == nil)
	s.metrics.setUp("redis", redisErr == nil)
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if healthy {
		st = healthpb.HealthCheckResponse_SERVING
	}
	s.health.SetServingStatus("", st)
}

func logChange(s *Server, dep string, wasUp bool, err error) {
	switch {
	case err != nil && wasUp:
		s.log.Error(dep+" is down; serving what does not need it and reporting unhealthy", "dependency", dep, "err", err)
	case err != nil && !wasUp:
		s.log.Debug(dep+" still down", "dependency", dep, "err", err)
	case err == nil && !wasUp:
		s.log.Info(dep+" is up", "dependency", dep)
	}
}

func (s *Server) migrateAndReseal(ctx context.Context) bool {
	n, err := s.store.Migrate(ctx)
	if err != nil {
		s.log.Error("migrations failed; will retry", "err", err)
		return false
	}
	s.log.Info("migrations applied", "applied", n)
	if s.keyring == nil {
		kr, err := s.newKeyring(ctx)
		if err != nil {
			s.log.Error("building the sealing keys failed; will retry", "err", err)
			return false
		}
		// Published to the services before migrated is set under s.mu.
		s.keyring, s.deps.Keyring = kr, kr
	}
	rep, err := s.store.Reseal(ctx, s.keyring)
	if err != nil {
		s.log.Error("re-sealing rows onto the current key failed; will retry", "err", err)
		return false
	}
	if err := s.loadAgentCA(ctx); errors.Is(err, seal.ErrUnknownKey) || errors.Is(err, seal.ErrOpen) {
		// Serve anyway: everything but enrolling new machines works, and
		// Enroll says why it cannot.
		s.caErr.Store(&err)
		s.log.Error("the agent CA key does not open with the configured keys: enrolling machines is off until its key is listed in database.postgres.previousEncryptionKeys", "err", err)
	} else if err != nil {
		s.log.Error("loading the agent CA failed; will retry", "err", err)
		return false
	}
	s.log.Info("sealed rows checked", "key_id", s.keyring.CurrentID(), "resealed", rep.Resealed,
		"stranded", rep.Stranded, "all_rows_on_current_key", rep.AllOnCurrentKey)
	return true
}

// newKeyring derives the sealing keys from the configured ones and the
// install's salt.
func (s *Server) newKeyring(ctx context.Context) (*seal.Keyring, error) {
	salt, err := s.store.SealSalt(ctx)
	if err != nil {
		return nil, err
	}
	pg := s.cfg.Database.Postgres
	return seal.NewKeyring(salt, pg.EncryptionKey, pg.PreviousEncryptionKeys...)
}

func (s *Server) ready(method string) error {
	if strings.HasPrefix(method, "/grpc.health.v1.Health/") {
		return nil
	}
	s.mu.Lock()
	migrated := s.migrated
	s.mu.Unlock()
	if !migrated {
		return status.Error(codes.Unavailable, "controlplane is starting: waiting for Postgres to answer and migrations to run")
	}
	return nil
}

func (s *Server) readyUnary() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if err := s.ready(info.FullMethod); err != nil {
			return nil, err
		}
		return h(ctx, req)
	}
}

func (s *Server) readyStream() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		if err := s.ready(info.FullMethod); err != nil {
			return err
		}
		return h(srv, ss)
	}
}

// secretOpener opens the secrets tasks name, once the sealing keys exist
// (the dependency loop builds them before it sets migrated).
type secretOpener struct{ s *Server }

func (o secretOpener) OpenSecret(ctx context.Context, workspaceID, name string) (map[string]string, error) {
	o.s.mu.Lock()
	migrated := o.s.migrated
	o.s.mu.Unlock()
	if !migrated {
		return nil, fmt.Errorf("open secret %q: the sealing keys are not loaded yet: %w", name, errdefs.ErrUnavailable)
	}
	return o.s.deps.OpenSecret(ctx, workspaceID, name)
}
