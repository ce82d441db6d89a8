// Package imagebuild owns levers9's container images (levers9-controlplane,
// levers9-worker, levers9-runner) built without a Docker engine: Debian
// root filesystems made by mmdebstrap and cached by their package list, the
// release binaries from dist/, layers and configs made with
// go-containerregistry so the same inputs give the same digest, the package
// list each image carries (Debian packages with versions, Go modules of its
// binaries; its sha256 is an image label), and pushing every build under
// the tag deployments follow plus a run tag no later build reuses.
//
// It never talks plain HTTP to a registry that is not on this machine
// unless told to (Options.Insecure), never writes outside the cache, the
// output directory and the registry it is given, and never hard-codes an
// apt mirror: mmdebstrap gets this machine's configured apt sources.
//
// API stability: internal to the build; names and flags may change with
// the release layout.
package imagebuild
