// Package api owns levers9's wire contracts: the protobuf definitions and
// the Go code generated from them, committed beside them. There are two:
//
//   - api/levers9/v1 (levers9.v1) is the public API the CLI, the SDK and
//     the REST gateway speak to the controlplane: auth and bootstrap,
//     workspaces and storage credentials, tokens, secrets, pools, machines
//     and their enrollment, tasks (FollowTask streams their events) and the
//     pools' security readiness report. gateway.yaml maps it to /api/v1/...
//     without annotations in the protos.
//   - api/levers9/agent/v1 (levers9.agent.v1) is the protocol on the tunnel:
//     the Controlplane service agents call (heartbeat, certificate renewal,
//     attempt reports) and the Agent service the controlplane calls (ping,
//     run, cancel and list tasks). It reuses levers9.v1 messages.
//
// This package itself holds only generate.sh and the test that fails when
// the committed code is stale (`make proto` regenerates it). It must never
// hold hand-written logic, never have the generated code edited by hand, and
// never import another part of levers9: everything else imports it.
//
// Stability: levers9.v1 is the public API; a released field or RPC keeps its
// number, name and meaning (add, never reuse or renumber; a break means
// levers9.v2). levers9.agent.v1 is not for third parties, but running agents
// can be older than their controlplane, so it follows the same field rules.
package api
