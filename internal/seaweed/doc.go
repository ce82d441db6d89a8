// Package seaweed runs and talks to SeaweedFS, the distributed filesystem
// behind levers9's seaweedfs volume driver: it supervises `weed` processes
// (master, volume server, filer, FUSE mount), restarting one that dies, each
// logging to its own file; it starts a single-node cluster whose filer keeps
// its metadata in Postgres; and it speaks the filer's HTTP API (mkdir,
// list, delete, usage).
//
// It secures every cluster it starts (security.go): gRPC is mutual TLS
// with the cluster's own CA, the volume server and the filer's HTTP API
// want JWTs, and the master's HTTP port answers its own host only; the
// credentials are generated once under the cluster's directory (0600
// files) and reach each server through a 0600 security.toml in its
// working directory. Filer signs its requests (FilerKeys); a mount gets
// its credentials as MountCredentials.
//
// It never puts a password or key in a process's argv: the filer's
// Postgres password goes to weed in its environment (viper's WEED_* keys),
// keys and certificates in 0600 files. It knows
// nothing of tasks, workspaces or the controlplane. Its API is internal and
// may change.
package seaweed
