// Package agent owns the node agent: joining (enrollment with a join token
// and a key that never leaves the machine), its state directory, and — as
// the other parts land — the tunnel client, inventory and heartbeats, and
// the task lifecycle. It dials out and never listens on a network port. It
// never imports the controlplane; it talks to it only through api/ over
// the tunnel or the enrollment call. API: internal to the agent binary.
package agent
