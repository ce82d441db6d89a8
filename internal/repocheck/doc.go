// Package repocheck holds repository-wide tests: every package has exactly
// one doc comment, and dependencies between the parts point one way (agent
// never imports the controlplane or pgx; sandbox, egress and tunnel import no
// other part; sdk and dashboard import only api and internal), with one
// exception: shared leaves such as sandbox/image/recipe, which import no
// other part themselves, may be imported from anywhere. It has no non-test
// code to call.
package repocheck
