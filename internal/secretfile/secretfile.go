// Package secretfile owns writing files that hold secrets (private keys,
// tokens, join scripts, the client's contexts file): mode 0600 in a
// directory created 0700, replaced atomically so a reader never sees a
// half-written file, and never looser than 0600 even over an existing file.
// It never reads secrets, never logs or returns file contents in an error,
// and never changes the mode of a directory that already exists. Internal:
// its API changes with its callers (enroll, the agent, the CLI, the SDK's
// client config).
package secretfile

import (
	"fmt"
	"os"
	"path/filepath"
)

// Write replaces path with b, mode 0600, atomically: b goes to a temporary
// file in the same directory, which is synced and renamed over path. A
// missing directory is created with mode 0700. On error path is left as it
// was.
func Write(path string, b []byte) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	f, err := os.CreateTemp(dir, ".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}
