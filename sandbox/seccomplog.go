package sandbox

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"
)

// auditSeccomp is the audit record type the kernel logs for SECCOMP_RET_LOG.
const auditSeccomp = "1326"

// SeccompEvent is one syscall that seccomp log mode let through but enforce
// would have refused.
type SeccompEvent struct {
	TaskID      string `json:"taskId,omitempty"`
	ContainerID string `json:"containerId,omitempty"`
	Pid         int    `json:"pid"`
	Syscall     int    `json:"syscall"`
	Arch        string `json:"arch"`
	Comm        string `json:"comm"`
	Exe         string `json:"exe"`
}

// SeccompLogConfig configures a SeccompLogReader.
type SeccompLogConfig struct {
	// Path defaults to /dev/kmsg; ProcRoot to /proc.
	Path, ProcRoot string
	// Prefix is the container ID prefix ("l9s") looked for in a pid's
	// cgroup path.
	Prefix string
	// Registerer gets levers9_sandbox_seccomp_logged_total.
	Registerer prometheus.Registerer
	// OnEvent is called from the reader's goroutine for every record; it
	// must not block for long.
	OnEvent func(SeccompEvent)
	Logger  *slog.Logger
}

// SeccompLogReader follows the kernel log for seccomp audit records
// (type 1326), attributes each to a container through the pid's cgroup, and
// counts them. Start returns once the log is open and positioned at its end
// (older records are never replayed); Stop blocks until the loop ended and
// is safe twice or before Start. Track/Untrack/Count are safe concurrently.
type SeccompLogReader struct {
	cfg     SeccompLogConfig
	counter *prometheus.CounterVec

	// mu guards tasks, counts, file and done.
	mu     sync.Mutex
	tasks  map[string]string // container ID -> task ID
	counts map[string]int    // container ID -> records
	file   *os.File
	done   chan struct{}
}

// NewSeccompLogReader registers the counter and returns a stopped reader.
func NewSeccompLogReader(cfg SeccompLogConfig) (*SeccompLogReader, error) {
	if cfg.Path == "" {
		cfg.Path = "/dev/kmsg"
	}
	if cfg.ProcRoot == "" {
		cfg.ProcRoot = "/proc"
	}
	if cfg.Prefix == "" {
		cfg.Prefix = "l9s"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "levers9_sandbox_seccomp_logged_total",
		Help: "Syscalls seccomp log mode let through that enforce would refuse (audit type 1326).",
	}, []string{"attributed"})
	if cfg.Registerer != nil {
		if err := cfg.Registerer.Register(c); err != nil {
			return nil, fmt.Errorf("seccomp log reader: register metric: %w", err)
		}
	}
	return &SeccompLogReader{cfg: cfg, counter: c, tasks: map[string]string{}, counts: map[string]int{}}, nil
}

// Track attributes records of a container to a task.
func (r *SeccompLogReader) Track(containerID, taskID string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.tasks[containerID] = taskID
}

// Untrack forgets a container once it is deleted.
func (r *SeccompLogReader) Untrack(containerID string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.tasks, containerID)
	delete(r.counts, containerID)
}

// Count returns how many records were attributed to a container.
func (r *SeccompLogReader) Count(containerID string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.counts[containerID]
}

// Start implements the loop contract.
func (r *SeccompLogReader) Start(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.done != nil {
		return errors.New("seccomp log reader: already started")
	}
	fd, err := unix.Open(r.cfg.Path, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("seccomp log reader: open %s: %w", r.cfg.Path, err)
	}
	if _, err := unix.Seek(fd, 0, io.SeekEnd); err != nil {
		unix.Close(fd)
		return fmt.Errorf("seccomp log reader: seek %s: %w", r.cfg.Path, err)
	}
	// Non-blocking, so the runtime poller owns it and Close unblocks Read.
	r.file = os.NewFile(uintptr(fd), r.cfg.Path)
	r.done = make(chan struct{})
	go r.loop(r.file, r.done)
	return nil
}

// Stop implements the loop contract.
func (r *SeccompLogReader) Stop() {
	r.mu.Lock()
	f, done := r.file, r.done
	r.file = nil
	r.mu.Unlock()
	if f != nil {
		f.Close()
	}
	if done == nil {
		return
	}
	<-done
	r.mu.Lock()
	if r.done == done {
		r.done = nil
	}
	r.mu.Unlock()
}

func (r *SeccompLogReader) loop(f *os.File, done chan struct{}) {
	defer close(done)
	buf := make([]byte, 8192)
	for {
		n, err := f.Read(buf)
		if errors.Is(err, syscall.EPIPE) {
			// The ring overwrote records we had not read yet.
			r.cfg.Logger.Warn("kernel log records lost")
			continue
		}
		if err != nil {
			if !errors.Is(err, os.ErrClosed) {
				r.cfg.Logger.Error("reading kernel log", "err", err)
			}
			return
		}
		ev, ok := parseSeccompRecord(string(buf[:n]))
		if !ok {
			continue
		}
		r.handle(ev)
	}
}

func (r *SeccompLogReader) handle(ev SeccompEvent) {
	ev.ContainerID = containerOfPid(r.cfg.ProcRoot, r.cfg.Prefix, ev.Pid)
	r.mu.Lock()
	if ev.ContainerID != "" {
		ev.TaskID = r.tasks[ev.ContainerID]
		r.counts[ev.ContainerID]++
	}
	r.mu.Unlock()
	r.counter.WithLabelValues(strconv.FormatBool(ev.ContainerID != "")).Inc()
	r.cfg.Logger.Info("seccomp would refuse", "task_id", ev.TaskID, "container_id", ev.ContainerID, "syscall", ev.Syscall, "comm", ev.Comm)
	if r.cfg.OnEvent != nil {
		r.cfg.OnEvent(ev)
	}
}

// containerOfPid finds the prefixed container ID in a pid's cgroup paths;
// "" when the process is gone or not in a container of ours.
func containerOfPid(procRoot, prefix string, pid int) string {
	f, err := os.Open(filepath.Join(procRoot, strconv.Itoa(pid), "cgroup"))
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// "4:memory:/l9s/l9s-task1": the container is the deepest
		// prefixed segment (a parent may carry the prefix too).
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		segs := strings.Split(parts[2], "/")
		for i := len(segs) - 1; i >= 0; i-- {
			if strings.HasPrefix(segs[i], prefix+"-") {
				return segs[i]
			}
		}
	}
	return ""
}

// parseSeccompRecord parses one /dev/kmsg record
// ("6,123,456,-;audit: type=1326 audit(...): ... pid=N comm=\"x\" ...").
func parseSeccompRecord(rec string) (SeccompEvent, bool) {
	_, msg, ok := strings.Cut(rec, ";")
	if !ok {
		return SeccompEvent{}, false
	}
	if i := strings.IndexByte(msg, '\n'); i >= 0 {
		msg = msg[:i]
	}
	if !strings.Contains(msg, "type="+auditSeccomp+" ") {
		return SeccompEvent{}, false
	}
	var ev SeccompEvent
	var havePid, haveNr bool
	for _, field := range splitAuditFields(msg) {
		k, v, ok := strings.Cut(field, "=")
		if !ok {
			continue
		}
		switch k {
		case "pid":
			n, err := strconv.Atoi(v)
			havePid = err == nil && n > 0
			ev.Pid = n
		case "syscall":
			n, err := strconv.Atoi(v)
			haveNr = err == nil && n >= 0
			ev.Syscall = n
		case "arch":
			ev.Arch = v
		case "comm":
			ev.Comm = strings.Trim(v, `"`)
		case "exe":
			ev.Exe = strings.Trim(v, `"`)
		}
	}
	if !havePid || !haveNr {
		return SeccompEvent{}, false
	}
	return ev, true
}

// splitAuditFields splits on spaces outside double quotes.
func splitAuditFields(s string) []string {
	var out []string
	var cur strings.Builder
	quoted := false
	for _, c := range s {
		switch {
		case c == '"':
			quoted = !quoted
			cur.WriteRune(c)
		case c == ' ' && !quoted:
			if cur.Len() > 0 {
				out = append(out, cur.String())
				cur.Reset()
			}
		default:
			cur.WriteRune(c)
		}
	}
	if cur.Len() > 0 {
		out = append(out, cur.String())
	}
	return out
}

// Audit architecture tokens (AUDIT_ARCH_*) as the kernel prints them.
const (
	auditArchX86_64  = "c000003e"
	auditArchAARCH64 = "c00000b7"
)

// SyscallName names a syscall of a seccomp record: "keyctl" on the
// architectures levers9 runs on, else "syscall N (arch A)".
func SyscallName(arch string, nr int) string {
	var m map[int]string
	switch strings.ToLower(arch) {
	case auditArchX86_64:
		m = syscallsAMD64
	case auditArchAARCH64:
		m = syscallsARM64
	}
	if name, ok := m[nr]; ok {
		return name
	}
	return fmt.Sprintf("syscall %d (arch %s)", nr, arch)
}
