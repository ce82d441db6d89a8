// Package repocheck holds repository-wide tests: every package has exactly
// one doc comment, and dependencies between the parts point one way (agent
// never imports the controlplane or pgx; sandbox, egress and tunnel import no
// other part; sdk and dashboard import only api and internal). It has no
// non-test code to call.
package repocheck
