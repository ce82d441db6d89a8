package localstack

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/levers9/levers9/internal/devstack"
	"github.com/levers9/levers9/internal/seaweed"
	"github.com/levers9/levers9/volumes"
)

// The local SeaweedFS: master, volume server and filer of
// internal/seaweed's single-node layout, run detached like the
// controlplane (pid files and logs under .levers9-dev/seaweedfs/), the
// filer's metadata in the database seaweedfs of the stack's Postgres.
// LEVERS9_VOLUMES=0 leaves it out (and volumes with it).

// VolumesEnv is the environment variable that turns the local SeaweedFS
// off when 0 (or false, no, off).
const VolumesEnv = "LEVERS9_VOLUMES"

// seaweedDatabase is the filer's database in the stack's Postgres.
const seaweedDatabase = "seaweedfs"

// SeaweedPorts are the local SeaweedFS's ports (HTTP and gRPC of each
// server), kept in State so a second Up finds the servers again.
type SeaweedPorts struct {
	Master     int `json:"master"`
	MasterGRPC int `json:"masterGrpc"`
	Volume     int `json:"volume"`
	VolumeGRPC int `json:"volumeGrpc"`
	Filer      int `json:"filer"`
	FilerGRPC  int `json:"filerGrpc"`
}

// volumesEnabled reports whether make up runs SeaweedFS.
func volumesEnabled(getenv func(string) string) bool {
	switch strings.ToLower(strings.TrimSpace(getenv(VolumesEnv))) {
	case "0", "false", "no", "off":
		return false
	}
	return true
}

func (p Paths) seaweedDir() string { return p.file("seaweedfs") }

func (p Paths) seaweedPid(server string) string {
	return filepath.Join(p.seaweedDir(), server+".pid")
}

// seaweedLayout is the local cluster with st's ports and Postgres.
func seaweedLayout(p Paths, st *State, bin string) (*seaweed.Layout, error) {
	ports := st.SeaweedFS
	if ports == nil {
		ports = &SeaweedPorts{}
	}
	return seaweed.NewLayout(seaweed.ClusterOptions{
		Bin: bin, Dir: p.seaweedDir(), Host: "127.0.0.1",
		MasterPort: ports.Master, MasterGRPCPort: ports.MasterGRPC,
		VolumePort: ports.Volume, VolumeGRPCPort: ports.VolumeGRPC,
		FilerPort: ports.Filer, FilerGRPCPort: ports.FilerGRPC,
		Postgres: seaweed.PostgresStore{Host: "127.0.0.1", Port: st.PostgresPort, User: "levers9",
			Password: st.PostgresPassword, Database: seaweedDatabase},
	})
}

// findWeed returns the weed binary: $LEVERS9_WEED_BIN when set, else what
// packaging/seaweedfs/build.sh prints (instant when cached). The build's
// progress goes to out.
func findWeed(ctx context.Context, p Paths, out io.Writer, say func(string, ...any)) (string, error) {
	if bin := os.Getenv("LEVERS9_WEED_BIN"); bin != "" {
		say("SeaweedFS: using weed %s ($LEVERS9_WEED_BIN)", bin)
		return bin, nil
	}
	script := filepath.Join(p.Root, "packaging", "seaweedfs", "build.sh")
	say("SeaweedFS: locating weed with %s (instant when cached; the first build takes 10-20 minutes, %s=0 skips volumes)", script, VolumesEnv)
	start := time.Now()
	var stdout bytes.Buffer
	cmd := exec.CommandContext(ctx, "bash", script)
	cmd.Stdout, cmd.Stderr = &stdout, out
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("building weed with %s: %w (or run make up with %s=0 to go without volumes)", script, err, VolumesEnv)
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	bin := lines[len(lines)-1]
	if fi, err := os.Stat(bin); err != nil || fi.Mode()&0o111 == 0 {
		return "", fmt.Errorf("%s printed %q, not an executable weed", script, bin)
	}
	if d := time.Since(start); d > 10*time.Second {
		say("SeaweedFS: weed built in %s", d.Round(time.Second))
	}
	return bin, nil
}

// ensureVolumes runs the local SeaweedFS unless LEVERS9_VOLUMES=0, and
// returns the weed binary the agents mount with and the cluster's layout
// ("" and nil when volumes are off).
func ensureVolumes(ctx context.Context, p Paths, st *State, out io.Writer, say func(string, ...any)) (string, *seaweed.Layout, error) {
	if !volumesEnabled(os.Getenv) {
		say("skipping SeaweedFS (%s=0): volumes will not work on this stack; run make up without it to have them", VolumesEnv)
		stopSeaweed(p, say)
		return "", nil, nil
	}
	weed, err := findWeed(ctx, p, out, say)
	if err != nil {
		return "", nil, err
	}
	sw, err := ensureSeaweed(ctx, p, st, weed, say)
	if err != nil {
		return "", nil, err
	}
	return weed, sw, nil
}

// seaweedRunning reports whether all three servers run.
func seaweedRunning(p Paths, st *State) bool {
	if st.SeaweedFS == nil {
		return false
	}
	for server, port := range map[string]int{"master": st.SeaweedFS.Master, "volume": st.SeaweedFS.Volume, "filer": st.SeaweedFS.Filer} {
		if !pidAlive(p.seaweedPid(server)) || !answers(port) {
			return false
		}
	}
	return true
}

// ensureSeaweed runs the local SeaweedFS (or finds it running) and returns
// its layout. A partly running cluster is stopped and started whole.
func ensureSeaweed(ctx context.Context, p Paths, st *State, bin string, say func(string, ...any)) (*seaweed.Layout, error) {
	if seaweedRunning(p, st) {
		l, err := seaweedLayout(p, st, bin)
		if err != nil {
			return nil, err
		}
		if seaweedSecured(l) {
			say("SeaweedFS already running (master 127.0.0.1:%d, filer %s)", st.SeaweedFS.Master, l.FilerURL())
			return l, nil
		}
		say("SeaweedFS runs without credentials (started by an older make up): restarting it secured")
	}
	stopSeaweed(p, say)
	if st.SeaweedFS == nil {
		st.SeaweedFS = &SeaweedPorts{}
	}
	sp := st.SeaweedFS
	seen := map[int]bool{}
	for _, port := range []*int{&sp.Master, &sp.MasterGRPC, &sp.Volume, &sp.VolumeGRPC, &sp.Filer, &sp.FilerGRPC} {
		// Keep a remembered port while it is free; ports picked free one
		// after another may repeat, so pick again then.
		if *port != 0 && !seen[*port] && !answers(*port) {
			seen[*port] = true
			continue
		}
		*port = 0
		for try := 0; *port == 0 || seen[*port]; try++ {
			if try == 5 {
				return nil, errors.New("SeaweedFS: no free port found")
			}
			var err error
			if *port, err = devstack.FreePort(); err != nil {
				return nil, err
			}
		}
		seen[*port] = true
	}
	if err := st.save(p); err != nil {
		return nil, err
	}
	if err := ensureDatabase(ctx, p, st, seaweedDatabase); err != nil {
		return nil, fmt.Errorf("SeaweedFS: the filer's database: %w", err)
	}
	l, err := seaweedLayout(p, st, bin)
	if err != nil {
		return nil, err
	}
	if err := l.Prepare(); err != nil {
		return nil, err
	}
	say("starting SeaweedFS: master 127.0.0.1:%d, volume server 127.0.0.1:%d, filer 127.0.0.1:%d (metadata in Postgres database %s; data and logs in %s)",
		sp.Master, sp.Volume, sp.Filer, seaweedDatabase, p.seaweedDir())
	for _, s := range l.Servers() {
		cmd := exec.Command(bin, s.Args...)
		cmd.Dir = s.Dir
		cmd.Env = append(os.Environ(), s.Env...)
		pid := p.seaweedPid(s.Name)
		if err := startDetached(cmd, s.LogPath, pid); err != nil {
			return nil, fmt.Errorf("start SeaweedFS %s (%s): %w", s.Name, bin, err)
		}
		if err := seaweed.WaitReady(ctx, s, 90*time.Second, func() bool { return !pidAlive(pid) }); err != nil {
			return nil, err
		}
	}
	if err := l.WaitWritable(ctx); err != nil {
		return nil, err
	}
	say("SeaweedFS ready: filer %s", l.FilerURL())
	return l, nil
}

// seaweedSecured reports whether the servers were started with the
// cluster's credentials: each has its security.toml, and they load.
func seaweedSecured(l *seaweed.Layout) bool {
	for _, s := range l.Servers() {
		if _, err := os.Stat(filepath.Join(s.Dir, "security.toml")); err != nil {
			return false
		}
	}
	_, err := l.Security()
	return err == nil
}

// ensureDatabase creates database name in the stack's Postgres unless it
// is there.
func ensureDatabase(ctx context.Context, p Paths, st *State, name string) error {
	pg := &devstack.Postgres{Dir: p.file("pg"), Host: "127.0.0.1", Port: st.PostgresPort, User: "levers9", Password: st.PostgresPassword}
	if err := pg.AttachForStop(); err != nil {
		return err
	}
	if err := pg.CreateDatabase(ctx, name); err != nil && !strings.Contains(err.Error(), "already exists") {
		return err
	}
	return nil
}

// stopSeaweed stops filer, volume server and master, in that order.
func stopSeaweed(p Paths, say func(string, ...any)) {
	for _, server := range []string{"filer", "volume", "master"} {
		stopProcess(p.seaweedPid(server), "SeaweedFS "+server, say)
	}
}

// unmountVolumes detaches the FUSE mounts left under the stack's directory
// (the agents' volume roots), deepest first, and ends the weed mount
// processes of this stack that outlived them. It returns what it
// unmounted.
func unmountVolumes(p Paths, say func(string, ...any)) []string {
	left, err := volumes.MountsUnder(p.Dir, "fuse")
	if err != nil {
		say("warning: %v", err)
		return nil
	}
	var done []string
	for _, m := range left {
		if err := unmount(m.Target); err != nil {
			say("warning: %v", err)
			continue
		}
		say("unmounted %s (%s)", m.Target, m.FSType)
		done = append(done, m.Target)
	}
	for _, pid := range weedMountsOf(p.Dir) {
		say("stopping a weed mount left running (pid %d)", pid)
		_ = syscall.Kill(pid, syscall.SIGTERM)
	}
	return done
}

// unmount tries fusermount3 -u, then a lazy umount.
func unmount(target string) error {
	var msgs []string
	for _, argv := range [][]string{{"fusermount3", "-u", target}, {"umount", "-l", target}} {
		out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
		if err == nil {
			return nil
		}
		msgs = append(msgs, fmt.Sprintf("%s: %v %s", strings.Join(argv, " "), err, strings.TrimSpace(string(out))))
	}
	return fmt.Errorf("unmounting %s: %s", target, strings.Join(msgs, "; "))
}

// weedMountsOf returns the pids of `weed mount` processes whose arguments
// name a path under dir: the mounts of this stack's agents, never another
// checkout's.
func weedMountsOf(dir string) []int {
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	var pids []int
	for _, f := range procs {
		b, err := os.ReadFile(f)
		if err != nil || !isWeedMountUnder(b, dir) {
			continue
		}
		if pid, err := strconv.Atoi(filepath.Base(filepath.Dir(f))); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

// isWeedMountUnder reports whether cmdline (NUL-separated, as in
// /proc/PID/cmdline) is a weed mount with an argument under dir.
func isWeedMountUnder(cmdline []byte, dir string) bool {
	args := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
	if len(args) < 2 || filepath.Base(args[0]) != "weed" || !slices.Contains(args[1:], "mount") {
		return false
	}
	dir = filepath.Clean(dir)
	for _, a := range args[1:] {
		if _, v, ok := strings.Cut(a, "="); ok {
			a = v
		}
		if strings.HasPrefix(a, dir+"/") {
			return true
		}
	}
	return false
}
