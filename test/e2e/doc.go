// Package e2e holds end-to-end tests that start the real stack: Postgres,
// Redis, the controlplane, the CLI and agent binaries, with machines in
// network namespaces the tests create. It has no non-test code.
package e2e
