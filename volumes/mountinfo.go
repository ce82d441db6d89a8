package volumes

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// MountEntry is one line of /proc/self/mountinfo, the parts volumes use.
type MountEntry struct {
	Target string
	FSType string
	Source string
}

// Mounts reads /proc/self/mountinfo.
func Mounts() ([]MountEntry, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("reading the mount table: %w", err)
	}
	defer f.Close()
	var out []MountEntry
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		// ID PARENT MAJ:MIN ROOT TARGET OPTS [OPTIONAL...] - FSTYPE SOURCE SUPEROPTS
		fields := strings.Fields(sc.Text())
		sep := -1
		for i, f := range fields {
			if f == "-" {
				sep = i
				break
			}
		}
		if len(fields) < 5 || sep < 0 || sep+2 >= len(fields) {
			continue
		}
		out = append(out, MountEntry{Target: unescape(fields[4]), FSType: fields[sep+1], Source: unescape(fields[sep+2])})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading the mount table: %w", err)
	}
	return out, nil
}

// MountedAt returns the topmost mount at target, if any.
func MountedAt(target string) (MountEntry, bool, error) {
	ms, err := Mounts()
	if err != nil {
		return MountEntry{}, false, err
	}
	target = filepath.Clean(target)
	for i := len(ms) - 1; i >= 0; i-- {
		if ms[i].Target == target {
			return ms[i], true, nil
		}
	}
	return MountEntry{}, false, nil
}

// MountsUnder returns the mounts at or below root whose filesystem type
// starts with fsPrefix ("fuse." for FUSE), deepest first so they can be
// unmounted in order.
func MountsUnder(root, fsPrefix string) ([]MountEntry, error) {
	ms, err := Mounts()
	if err != nil {
		return nil, err
	}
	root = filepath.Clean(root)
	var out []MountEntry
	for i := len(ms) - 1; i >= 0; i-- {
		m := ms[i]
		if (m.Target == root || strings.HasPrefix(m.Target, root+"/")) && strings.HasPrefix(m.FSType, fsPrefix) {
			out = append(out, m)
		}
	}
	return out, nil
}

// unescape undoes mountinfo's octal escapes (\040 for a space).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var v byte
			ok := true
			for _, c := range s[i+1 : i+4] {
				if c < '0' || c > '7' {
					ok = false
					break
				}
				v = v*8 + byte(c-'0')
			}
			if ok {
				b.WriteByte(v)
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
