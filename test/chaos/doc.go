// Package chaos holds the whole-stack fault run: two controlplane replicas
// over one Postgres and one Redis, the image registry, and three agents in
// network namespaces, all real processes, running a mix of tasks through
// the Go SDK while replicas, agents, Redis, Postgres and the tunnels' packets
// fail at random; at the end it checks that nothing was lost, duplicated or
// left behind. `make test` runs a short form; `make chaos` runs it for
// LEVERS9_CHAOS_DURATION (30m). It has no non-test code.
package chaos
