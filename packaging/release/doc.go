// Package release holds `make release` (release.sh beside this file) and
// its test; it has no Go API. release.sh owns the layout of dist/: the CLI,
// controlplane and agent for linux/amd64 and linux/arm64 named
// NAME-linux-ARCH (the names controlplane/agentdist serves agents by),
// SHA256SUMS and VERSION, with the version, commit and commit time stamped
// into internal/version. It must stay reproducible (no build time, no paths,
// no VCS stamping: two runs of one commit give the same sums) and must never
// run an arm64 binary, only read its ELF header. Image builds read dist/ as
// it is, so the names are a stable interface.
package release
