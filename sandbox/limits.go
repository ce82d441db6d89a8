package sandbox

import (
	"bufio"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// LimitKills says whether the kernel enforced a container's limits: how
// many processes its memory cgroup killed, and how many forks its pids
// limit refused. Read once the process exited, before Delete removes the
// cgroup.
type LimitKills struct {
	OOMKills uint64
	PidsMax  uint64
}

// cgroupRoot is where the cgroup hierarchies are mounted.
const cgroupRoot = "/sys/fs/cgroup"

// LimitKills reads the container cgroup's event counters (cgroup v2
// memory.events and pids.events, or v1 memory.oom_control and
// pids.events). A counter it cannot read is zero; the error says none
// could be read (the runtime already removed the cgroup, or runs its own).
func (h *Handle) LimitKills() (LimitKills, error) {
	if h.cgroup == "" {
		return LimitKills{}, errors.New("limit kills: no cgroup")
	}
	return readLimitKills(cgroupRoot, h.cgroup)
}

func readLimitKills(root, cgroup string) (LimitKills, error) {
	var k LimitKills
	var errs []error
	read := func(dst *uint64, key string, paths ...string) {
		for _, p := range paths {
			v, err := counter(filepath.Join(root, p), key)
			if err == nil {
				*dst = v
				return
			}
			errs = append(errs, err)
		}
	}
	read(&k.OOMKills, "oom_kill", filepath.Join(cgroup, "memory.events"), filepath.Join("memory", cgroup, "memory.oom_control"))
	read(&k.PidsMax, "max", filepath.Join(cgroup, "pids.events"), filepath.Join("pids", cgroup, "pids.events"))
	if len(errs) == 4 {
		return k, errors.Join(errs...)
	}
	return k, nil
}

// counter reads "key value" from a flat-keyed cgroup file.
func counter(path, key string) (uint64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if ok && k == key {
			return strconv.ParseUint(strings.TrimSpace(v), 10, 64)
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, os.ErrNotExist
}
