// Package seaweed runs and talks to SeaweedFS, the distributed filesystem
// behind levers9's seaweedfs volume driver: it supervises `weed` processes
// (master, volume server, filer, FUSE mount), restarting one that dies, each
// logging to its own file; it starts a single-node cluster whose filer keeps
// its metadata in Postgres; and it speaks the filer's HTTP API (mkdir,
// list, delete, usage).
//
// It never puts a password in a process's argv: the filer's Postgres
// password goes to weed in its environment (viper's WEED_* keys). It knows
// nothing of tasks, workspaces or the controlplane. Its API is internal and
// may change.
package seaweed
