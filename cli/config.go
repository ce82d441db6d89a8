// Package cli owns the levers9 command line: its contexts file
// (~/.levers9/config.toml, mode 0600), how it reaches a controlplane (TLS on
// port 443 always, elsewhere only when the context or
// LEVERS9_CONTROLPLANE_TLS says so), the first-run prompt that can
// bootstrap, and the commands. It talks to the controlplane only through the
// public API in api/. It never prints or logs a token except the one
// `token create` shows once, and never takes secrets in argv.
package cli

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"github.com/pelletier/go-toml/v2"

	"github.com/levers9/levers9/enroll"
)

// Context is one named controlplane the CLI can talk to.
type Context struct {
	Controlplane string `toml:"controlplane"`
	Token        string `toml:"token,omitempty"`
	TLS          bool   `toml:"tls,omitempty"`
	// CAFile trusts a private CA (a dev stack's self-signed certificate).
	CAFile string `toml:"ca_file,omitempty"`
}

// File is ~/.levers9/config.toml.
type File struct {
	Current  string             `toml:"current"`
	Contexts map[string]Context `toml:"contexts"`
}

// ErrNoConfig means the CLI has no config file yet.
var ErrNoConfig = errors.New("no levers9 CLI config")

// Dir is the CLI's state directory: $LEVERS9_HOME, else ~/.levers9.
func Dir(getenv func(string) string) (string, error) {
	if d := getenv("LEVERS9_HOME"); d != "" {
		return d, nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("find your home directory (or set LEVERS9_HOME): %w", err)
	}
	return filepath.Join(home, ".levers9"), nil
}

// LoadFile reads the config; a missing file is ErrNoConfig.
func LoadFile(dir string) (*File, error) {
	path := filepath.Join(dir, "config.toml")
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, ErrNoConfig
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	var f File
	if err := toml.NewDecoder(bytes.NewReader(b)).DisallowUnknownFields().Decode(&f); err != nil {
		return nil, fmt.Errorf("%s does not parse (fix or delete it): %w", path, err)
	}
	if f.Contexts == nil {
		f.Contexts = map[string]Context{}
	}
	return &f, nil
}

// Save writes the config atomically with mode 0600 (it holds tokens), in a
// 0700 directory.
func (f *File) Save(dir string) error {
	b, err := toml.Marshal(f)
	if err != nil {
		return err
	}
	if err := enroll.WriteSecretFile(filepath.Join(dir, "config.toml"), b); err != nil {
		return fmt.Errorf("write config: %w", err)
	}
	return nil
}

// Names lists the contexts in order.
func (f *File) Names() []string {
	names := make([]string, 0, len(f.Contexts))
	for n := range f.Contexts {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}
