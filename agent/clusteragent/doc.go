// Package clusteragent is `levers9-agent cluster`: the agent of an
// attached Kubernetes cluster (`levers9 cluster join`). It joins and keeps
// its tunnel exactly as a machine's agent does (package agent: join,
// session, heartbeats, certificate renewal), but runs no task itself: its
// inventory is the cluster's Ready, schedulable nodes (the sum of their
// allocatable CPU, memory and nvidia.com/gpu, and the largest node), and
// it serves the ClusterAgent push service on its tunnel, with which the
// controlplane has it create, list and remove worker Jobs in its own
// namespace (internal/kubeworkers, the same Jobs a provider kubernetes
// pool gets). It watches those workers' pods and reports one deleted,
// evicted or failed to the controlplane at once (WorkerGone), so the
// attempt it ran is retried without waiting for the lost-agent grace.
//
// It is the only agent package that imports client-go (a repository test
// keeps the machine agent free of it). It talks to its own API server with
// the pod's service account (in-cluster config; --kubeconfig for tests)
// and never to any other: the controlplane holds no credential for the
// cluster. Worker join tokens arrive in MakeWorker's body, go into the
// worker's Secret and are never logged, returned or read back. It acts
// only on its --pool and its --namespace. API: internal to the agent
// binary.
package clusteragent
