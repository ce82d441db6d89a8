package inventory

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// kernelRelease returns uname -r.
func kernelRelease() (string, error) {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "", fmt.Errorf("uname: %w", err)
	}
	return string(bytes.TrimRight(u.Release[:], "\x00")), nil
}

// diskUsage reports the filesystem holding dir.
func diskUsage(dir string) (Disk, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return Disk{}, fmt.Errorf("statfs %s: %w", dir, err)
	}
	bsize := uint64(st.Bsize)
	return Disk{
		Path:       dir,
		TotalBytes: st.Blocks * bsize,
		FreeBytes:  st.Bavail * bsize,
	}, nil
}

// appArmorEnabled reads the apparmor module's "enabled" parameter. A kernel
// without AppArmor has no such file, which is a plain "no".
func appArmorEnabled(sysDir string) (bool, error) {
	path := filepath.Join(sysDir, "module", "apparmor", "parameters", "enabled")
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read %s: %w", path, err)
	}
	return parseAppArmorEnabled(string(b))
}

// parseAppArmorEnabled parses the module parameter, a kernel bool ("Y"/"N").
func parseAppArmorEnabled(s string) (bool, error) {
	switch strings.TrimSpace(s) {
	case "Y":
		return true, nil
	case "N":
		return false, nil
	}
	return false, fmt.Errorf("apparmor enabled parameter: want Y or N, got %q", truncate(s, 32))
}

// truncate shortens s for error messages so odd input cannot flood a log.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
