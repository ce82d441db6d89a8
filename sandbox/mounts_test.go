package sandbox

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/levers9/levers9/internal/errdefs"
	"github.com/levers9/levers9/internal/testenv"
)

func TestMountValidator(t *testing.T) {
	dir := t.TempDir()
	state := filepath.Join(dir, "agent-state")
	safe := filepath.Join(dir, "data")
	for _, d := range []string{state, safe} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	link := func(name, target string) string {
		p := filepath.Join(dir, name)
		if err := os.Symlink(target, p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	etcLink := link("innocent", "/etc")
	stateLink := link("cache", state)
	for _, tc := range []struct {
		name    string
		source  string
		refused bool
		reason  string
	}{
		{"plain data dir", safe, false, ""},
		{"host root", "/", true, "host root"},
		{"proc", "/proc", true, "is /proc"},
		{"under sys", "/sys/kernel", true, "under /sys"},
		{"dev", "/dev", true, "is /dev"},
		{"etc via dotdot", safe + "/../../../../../../etc", true, "is /etc"},
		{"etc via symlink", etcLink, true, "is /etc"},
		{"agent state via symlink", stateLink, true, "is " + state},
		{"parent of agent state", dir, true, "contains " + state},
		{"runtime dir containing sockets", "/run", true, "contains"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mounts := []Mount{{Source: tc.source, Destination: "/data"}}
			enforce := MountValidator{Mode: MountValidationEnforce, Extra: []string{state}}
			viol, err := enforce.Check(context.Background(), "t1", mounts)
			if tc.refused {
				if !errdefs.IsPermissionDenied(err) || len(viol) != 1 || !strings.Contains(err.Error(), "task.mounts[0].source") || !strings.Contains(viol[0].Reason, tc.reason) {
					t.Fatalf("enforce: %v %+v, want refused with %q", err, viol, tc.reason)
				}
			} else if err != nil || len(viol) != 0 {
				t.Fatalf("enforce refused a safe mount: %v", err)
			}
			logMode := MountValidator{Mode: MountValidationLog, Extra: []string{state}}
			viol, err = logMode.Check(context.Background(), "t1", mounts)
			if err != nil || (len(viol) == 1) != tc.refused {
				t.Errorf("log mode: %v %+v", err, viol)
			}
		})
	}
	if _, err := (MountValidator{Mode: MountValidationLog}).Check(context.Background(), "t1", []Mount{{Source: filepath.Join(dir, "missing"), Destination: "/x"}}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("missing source: %v", err)
	}
	if _, err := (MountValidator{Mode: "strict"}).Check(context.Background(), "t1", nil); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "worker.volumeMountValidation") {
		t.Errorf("bad mode: %v", err)
	}
}

func FuzzSensitive(f *testing.F) {
	denied := []string{"/proc", "/etc", "/run/l9s"}
	f.Add("/etc")
	f.Add("/data/x")
	f.Add("/run")
	f.Fuzz(func(t *testing.T, p string) {
		if !filepath.IsAbs(p) || filepath.Clean(p) != p {
			return
		}
		r := sensitive(p, denied)
		for _, d := range denied {
			if (p == d || strings.HasPrefix(p, d+"/") || strings.HasPrefix(d, p+"/") || p == "/") && r == "" {
				t.Fatalf("%q not refused", p)
			}
		}
	})
}

// TestVolumeMountedNosuidNodev checks inside a real container that a user
// volume cannot carry setuid binaries or device nodes.
func TestVolumeMountedNosuidNodev(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireBinary(t, "runc")
	b := setupSandbox(t)
	rootfs := makeRootfs(t, "")
	vol := t.TempDir()
	if err := os.WriteFile(filepath.Join(vol, "hello"), []byte("from volume\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out testenv.SyncBuffer
	task := TaskSpec{ID: "vol", Rootfs: rootfs, Args: []string{"sh", "-c", "cat /data/hello; busybox grep ' /data ' /proc/self/mounts"},
		Mounts: []Mount{{Source: vol, Destination: "/data", ReadOnly: true}}}
	h, err := b.sb.Run(ctx, task, Security{Profile: ProfileHardened, Seccomp: SeccompEnforce, Runtime: RuntimeRunc}, Stdio{Stdout: &out, Stderr: &out})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Delete(context.Background()) })
	if st, err := h.Wait(ctx); err != nil || st.Code != 0 {
		t.Fatalf("exit %+v %v: %s", st, err, out.String())
	}
	got := out.String()
	if !strings.Contains(got, "from volume") {
		t.Fatalf("volume not visible: %q", got)
	}
	for _, opt := range []string{"ro", "nosuid", "nodev"} {
		if !strings.Contains(got, opt) {
			t.Errorf("volume mount lacks %s: %q", opt, got)
		}
	}

	// Enforce refuses /etc before anything is created.
	sb, err := New(Config{StateDir: "/run/l9s-test", CgroupParent: "/l9s-test", Host: b.host, MountValidation: MountValidationEnforce})
	if err != nil {
		t.Fatal(err)
	}
	_, err = sb.Run(ctx, TaskSpec{ID: "vol-etc", Rootfs: rootfs, Args: []string{"true"}, Mounts: []Mount{{Source: "/etc", Destination: "/host-etc"}}}, Security{Runtime: RuntimeRunc}, Stdio{})
	if !errdefs.IsPermissionDenied(err) || errdefs.IsRetryable(err) {
		t.Errorf("mounting /etc under enforce: %v", err)
	}
	if _, err := os.Stat("/run/l9s-test/l9s-vol-etc"); !os.IsNotExist(err) {
		t.Errorf("refused task left a container dir: %v", err)
	}
}

// TestOnlyTaskVolumesJudged runs real containers whose agent mount (a
// resolv.conf under the agent's state directory, a sensitive path) sits
// beside a task volume: in log mode only the task's /etc volume is
// logged, once; in enforce mode the agent mount alone runs and the /etc
// volume is refused.
func TestOnlyTaskVolumesJudged(t *testing.T) {
	b, rootfs := setupRuntimes(t, "runc")
	agentState := t.TempDir()
	resolv := filepath.Join(agentState, "network", "resolv.conf")
	if err := os.MkdirAll(filepath.Dir(resolv), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(resolv, []byte("nameserver 192.0.2.53\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	agentMounts := []Mount{{Source: resolv, Destination: "/etc/resolv.conf", ReadOnly: true}}
	etc := []Mount{{Source: "/etc", Destination: "/host-etc", ReadOnly: true}}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// run starts a task on a node whose validation is mode, in a pool
	// whose pushed validation is poolMode.
	runIn := func(t *testing.T, mode, poolMode MountValidation, id string, mounts []Mount) (string, string, error) {
		t.Helper()
		var logs, out testenv.SyncBuffer
		sb, err := New(Config{StateDir: "/run/l9s-test", CgroupParent: "/l9s-test", Host: b.host, MountValidation: mode,
			SensitivePaths: []string{agentState}, Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
		if err != nil {
			t.Fatal(err)
		}
		task := TaskSpec{ID: id, Rootfs: rootfs, Args: []string{"cat", "/etc/resolv.conf"}, Mounts: mounts, AgentMounts: agentMounts}
		h, err := sb.Run(ctx, task, Security{Profile: ProfileHardened, Seccomp: SeccompEnforce, Runtime: RuntimeRunc, MountValidation: poolMode},
			Stdio{Stdout: &out, Stderr: &out})
		if err != nil {
			return logs.String(), out.String(), err
		}
		defer func() { _ = h.Delete(context.Background()) }()
		if st, err := h.Wait(ctx); err != nil || st.Code != 0 {
			t.Fatalf("exit %+v %v: %s", st, err, out.String())
		}
		return logs.String(), out.String(), nil
	}
	run := func(t *testing.T, mode MountValidation, id string, mounts []Mount) (string, string, error) {
		t.Helper()
		return runIn(t, mode, "", id, mounts)
	}
	const warning = "sensitive volume mount allowed in log mode"

	t.Run("log", func(t *testing.T) {
		logs, out, err := run(t, MountValidationLog, "judged-log", etc)
		if err != nil || !strings.Contains(out, "192.0.2.53") {
			t.Fatalf("run: %v, output %q", err, out)
		}
		if n := strings.Count(logs, warning); n != 1 || !strings.Contains(logs, `"source":"/etc"`) || strings.Contains(logs, resolv) {
			t.Errorf("want one warning, for /etc only; got %d in %s", n, logs)
		}
	})
	t.Run("enforce agent mount only", func(t *testing.T) {
		logs, out, err := run(t, MountValidationEnforce, "judged-agent", nil)
		if err != nil || !strings.Contains(out, "192.0.2.53") || logs != "" {
			t.Fatalf("run: %v, output %q, logs %s", err, out, logs)
		}
	})
	t.Run("enforce task volume", func(t *testing.T) {
		_, _, err := run(t, MountValidationEnforce, "judged-etc", etc)
		if !errdefs.IsPermissionDenied(err) || !strings.Contains(err.Error(), "task.mounts[0].source") || strings.Contains(err.Error(), resolv) {
			t.Errorf("mounting /etc under enforce: %v", err)
		}
	})
	// The pool's pushed worker.volumeMountValidation: enforce wins over a
	// node left at log, and log on an enforcing node loosens nothing.
	t.Run("pool enforce on a log node", func(t *testing.T) {
		logs, _, err := runIn(t, MountValidationLog, MountValidationEnforce, "judged-pool", etc)
		if !errdefs.IsPermissionDenied(err) || !strings.Contains(err.Error(), "task.mounts[0].source") || strings.Contains(logs, warning) {
			t.Errorf("mounting /etc in a pool set to enforce: %v (logs %s)", err, logs)
		}
	})
	t.Run("pool log on an enforcing node", func(t *testing.T) {
		_, _, err := runIn(t, MountValidationEnforce, MountValidationLog, "judged-node", etc)
		if !errdefs.IsPermissionDenied(err) {
			t.Errorf("mounting /etc on a node set to enforce, pool at log: %v", err)
		}
	})
	t.Run("pool log on a log node", func(t *testing.T) {
		logs, out, err := runIn(t, MountValidationLog, MountValidationLog, "judged-both-log", etc)
		if err != nil || !strings.Contains(out, "192.0.2.53") || strings.Count(logs, warning) != 1 {
			t.Errorf("log everywhere: %v, output %q, logs %s", err, out, logs)
		}
	})
}
