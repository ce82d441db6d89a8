// Package recipe owns the image recipe: the declarative spec a user writes
// (a base image, then run, env, workdir, copy, apt and pip steps, then user,
// entrypoint and cmd), its parsing and validation, and its content-addressed
// identity.
//
// The same code serves every side: the CLI and the Go SDK build or parse a
// Recipe, tar each copy step's source with TarSource, upload it and fill in
// Copy.Blob, then send Marshal's canonical JSON; the controlplane parses and
// validates it again, resolves the base to a digest and computes StepKeys
// and Hash to decide what is already built; the agent executes the Rendered
// steps.
//
// Identity: a seed is derived from the base image's digest (never its tag),
// and each rendered step's key chains the previous key with the step's
// canonical form, so changing step i changes keys i.. only and a rebuild can
// reuse the layers of steps before it. A copy step is identified by the
// digest of its content (Blob), never by its local path (Src). Hash, the
// image's identity, adds user, entrypoint and cmd to the last step key. These
// definitions are versioned by the seed's "levers9-recipe-v1" prefix: any
// change to them must change that prefix, or old cache entries would be
// served for recipes that now mean something else.
//
// apt and pip package names are checked against a strict pattern and quoted
// before they are rendered into shell commands; run steps are shell commands
// by design and are the user's own.
//
// It must never: import the controlplane, the agent, api/ or any other
// levers9 part (the SDK and the CLI link it); perform I/O other than
// TarSource reading the source it is given; follow a symlink while taring;
// talk to a registry (callers resolve the base to a digest); or let a local
// path (Copy.Src) influence a key.
//
// API stability: experimental. The field names and the YAML/JSON form are
// what users write and should only grow; the key derivation is frozen per
// seed version.
package recipe
