// Package egress owns container networking on a node: one bridge, a network
// namespace and veth pair per container, addresses from configured IPv4 and
// IPv6 (ULA) subnets, outbound NAT, a per-container resolv.conf, bridge port
// isolation, and the iptables egress chains (IPv4 and IPv6 alike) that keep
// containers off cloud metadata services, the node itself, each other and
// private, shared and link-local ranges, in an observe or enforce mode. It
// turns rule counters into the worker_container_egress_matches_total metric,
// logs rate-limited matches read from NFLOG, and aggregates what would have
// been refused into a readiness report.
//
// Every host object it creates (bridge, veths, named network namespaces,
// chains, resolv.conf directories) carries the configured prefix, and it must
// never touch an object without that prefix: the only shared host state it
// edits is one jump rule at the head of the built-in FORWARD, INPUT and nat
// POSTROUTING chains (plus the forwarding and bridge-nf-call sysctls).
// Chains are named by a hash of their content: a changed chain is built
// under its new name and the jumps are swapped in the same iptables-restore
// transaction, never flushed in place, so there is no fail-open moment, and
// an unchanged container chain keeps its counters. It knows nothing of the
// controlplane, tasks beyond their ID/task/pool labels, or runtimes.
//
// API stability: experimental. The agent calls NewNode, Setup, AddContainer,
// RemoveContainer, Reconcile, Start/Stop and Uninstall; the Config mirrors
// worker.containerSecurity.{bridgePortIsolation,egress.mode,egress.allow} and
// may grow fields. The rule layout (chain names, comments) is internal and may
// change between versions; Reconcile removes any older generation.
package egress
