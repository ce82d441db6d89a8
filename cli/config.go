// Package cli owns the levers9 command line: the commands, the first-run
// prompt that can bootstrap, and how errors become advice. Its contexts
// file (~/.levers9/config.toml, mode 0600) and the rules for reaching a
// controlplane (TLS on port 443 always, elsewhere only when the context or
// LEVERS9_CONTROLPLANE_TLS says so) live in internal/clientconfig, shared
// with the Go SDK; tasks are submitted and followed through sdk/. It talks
// to the controlplane only through the public API in api/. It never prints
// or logs a token except the one `token create` shows once, and never takes
// secrets in argv.
package cli

import "github.com/levers9/levers9/internal/clientconfig"

// Context is one named controlplane the CLI can talk to.
type Context = clientconfig.Context

// File is ~/.levers9/config.toml.
type File = clientconfig.File

// ErrNoConfig means the CLI has no config file yet.
var ErrNoConfig = clientconfig.ErrNoConfig

// Dir is the CLI's state directory: $LEVERS9_HOME, else ~/.levers9.
func Dir(getenv func(string) string) (string, error) { return clientconfig.Dir(getenv) }

// LoadFile reads the config; a missing file is ErrNoConfig.
func LoadFile(dir string) (*File, error) { return clientconfig.LoadFile(dir) }
