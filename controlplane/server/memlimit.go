package server

import (
	"bufio"
	"bytes"
	"fmt"
	"path"
	"strconv"
	"strings"
)

// memLimitShare is the part of the cgroup's memory limit the Go runtime is
// asked to stay under (debug.SetMemoryLimit): the rest is headroom for
// memory the runtime does not count (stacks of cgo threads, the kernel's
// socket buffers of thousands of agents' connections).
const memLimitShare = 0.9

// memoryLimit decides the Go runtime's soft memory limit at start: none
// when GOMEMLIMIT is set (the runtime has applied it) or the process's
// memory cgroup (v2 memory.max, v1 memory.limit_in_bytes) has no limit;
// otherwise memLimitShare of that limit, so the garbage collector works
// harder near the limit instead of the kernel's OOM killer ending the
// replica mid-storm. source says where the figure came from, for the log.
// A cgroup file that does not parse is an error and no limit: the
// replica runs as before.
func memoryLimit(getenv func(string) (string, bool), readFile func(string) ([]byte, error)) (limit int64, source string, err error) {
	if v, ok := getenv("GOMEMLIMIT"); ok && v != "" {
		return 0, "GOMEMLIMIT", nil
	}
	cg, err := readFile("/proc/self/cgroup")
	if err != nil {
		return 0, "", fmt.Errorf("read /proc/self/cgroup: %w", err)
	}
	v2, v1 := "", ""
	haveV1 := false
	sc := bufio.NewScanner(bytes.NewReader(cg))
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		switch {
		case parts[0] == "0" && parts[1] == "":
			v2 = parts[2]
		case containsController(parts[1], "memory"):
			v1, haveV1 = parts[2], true
		}
	}
	var file string
	switch {
	case haveV1:
		file = path.Join("/sys/fs/cgroup/memory", v1, "memory.limit_in_bytes")
	case v2 != "":
		file = path.Join("/sys/fs/cgroup", v2, "memory.max")
	default:
		return 0, "", nil
	}
	b, err := readFile(file)
	if err != nil {
		return 0, "", fmt.Errorf("read %s: %w", file, err)
	}
	s := strings.TrimSpace(string(b))
	if s == "max" {
		return 0, "", nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 {
		return 0, "", fmt.Errorf("%s holds %q, not a byte count", file, s)
	}
	// cgroup v1 writes "no limit" as the largest page-aligned int64.
	if n >= 1<<62 {
		return 0, "", nil
	}
	return int64(float64(n) * memLimitShare), file, nil
}

func containsController(list, name string) bool {
	for _, c := range strings.Split(list, ",") {
		if c == name {
			return true
		}
	}
	return false
}
