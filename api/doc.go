// Package api owns levers9's wire contracts: the protobuf definitions under
// api/levers9/v1 (the public API: workspaces, tokens, secrets, and later
// pools, machines and tasks) and the Go code generated from them, which is
// committed. It must never contain hand-written logic beyond this doc and the
// staleness test. Field numbers are stable once released; add, never reuse.
package api
