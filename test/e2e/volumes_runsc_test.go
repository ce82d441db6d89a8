package e2e

import (
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/levers9/levers9/controlplane/config"
	"github.com/levers9/levers9/controlplane/controlplanetest"
	"github.com/levers9/levers9/internal/seaweed/seaweedtest"
	"github.com/levers9/levers9/internal/testenv"
)

// TestVolumesRunsc: one volume shared by a runsc pool (its agent in the
// host's root network namespace, as in TestRunscPoolAgentInRootNamespace)
// and a runc pool (its agent in a box of its own), so two machines and two
// runtimes: what a gVisor task writes reaches the volume and a runc task on
// the other machine reads it, what the runc task writes the gVisor task
// reads, and a read-only mount refuses writes under gVisor.
func TestVolumesRunsc(t *testing.T) {
	testenv.RequireRoot(t)
	if _, err := os.Stat("/dev/fuse"); err != nil {
		testenv.Missing(t, "/dev/fuse: %v", err)
	}
	testenv.RequireBinary(t, "fusermount3", "runsc", "iptables")
	weed := seaweedtest.Bin(t)
	t.Setenv(seaweedtest.BinEnv, weed)
	w := &taskWorld{runs: map[string]machineRun{}}
	w.joinWorld = setupJoinWorldWith(t, func(c *config.Config) {
		w.demoImage(t, c)
		dir := t.TempDir()
		if err := os.Chmod(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		sw := seaweedtest.StartWith(t, weed, env.PG, dir, c.Controlplane.PublicHost)
		c.Volumes.SeaweedFS.FilerAddr = sw.Cluster.FilerAddr()
		c.Volumes.SeaweedFS.FilerURL = sw.Cluster.FilerURL()
		c.Volumes.SeaweedFS.SecurityDir = sw.Cluster.SecurityDir()
		c.Worker.Pools["gvisor"] = config.Pool{Runtime: "runsc"}
	})
	w.boxes = []*box{w.joinWorld.box}
	out, errOut, err := w.cli(t, "machine", "create", "--pool", "default", "--name", "box")
	if err != nil {
		t.Fatalf("machine create: %v %s", err, errOut)
	}
	runcID := regexp.MustCompile(`machine (m_[a-z2-7]+)`).FindStringSubmatch(out)[1]
	m := machineRun{box: w.joinWorld.box, script: w.home + "/machines/" + runcID + ".sh", root: t.TempDir()}
	w.runs[runcID] = m
	w.startAgent(t, m)
	gvisor := startHostAgent(t, w.joinWorld, "gvisor", w.registry)
	controlplanetest.Eventually(t, 60*time.Second, "both machines online", func() bool {
		online := 0
		for _, m := range w.machines(t) {
			if m.State == "MACHINE_STATE_ONLINE" {
				online++
			}
		}
		return online == 2
	})
	if out, errOut, err := w.cli(t, "volume", "create", "data"); err != nil {
		t.Fatalf("volume create: %v\n%s\n%s", err, out, errOut)
	}
	// run runs a task and returns its exit code, output and machine.
	run := func(t *testing.T, args ...string) (int, string, string) {
		t.Helper()
		r := w.start(t, args...)
		code := r.wait(t, 120*time.Second)
		so, se := r.out()
		machine := ""
		if ts := w.tasks(t); len(ts) > 0 && len(ts[0].Attempts) > 0 {
			machine = ts[0].Attempts[len(ts[0].Attempts)-1].MachineID
		}
		return code, so + se, machine
	}
	onMachine := func(t *testing.T, got, want, what string) {
		t.Helper()
		if got != want {
			t.Fatalf("%s ran on %q, want %q", what, got, want)
		}
	}

	t.Run("a gVisor task writes, a runc task on another machine reads", func(t *testing.T) {
		code, out, on := run(t, "run", "--pool", "gvisor", "--volume", "data:/data", "--", "sh", "-c",
			"mkdir -p /data/ckpt && echo from-gvisor > /data/ckpt/state && grep ' /data ' /proc/mounts")
		// gVisor's own mount table: a gofer mount whose cache the sentry
		// revalidates (runsc --file-access-mounts=shared), nosuid.
		if code != 0 || !strings.Contains(out, "cache=remote_revalidating") || !strings.Contains(out, "nosuid") {
			t.Fatalf("gVisor writer: exit %d\n%s", code, out)
		}
		onMachine(t, on, gvisor.id, "the gVisor writer")
		code, out, on = run(t, "run", "--volume", "data:/in:ro", "--", "cat", "/in/ckpt/state")
		if code != 0 || !strings.Contains(out, "from-gvisor") {
			t.Fatalf("runc reader: exit %d\n%s", code, out)
		}
		onMachine(t, on, runcID, "the runc reader")
	})

	t.Run("a runc task writes, a gVisor task reads", func(t *testing.T) {
		code, out, _ := run(t, "run", "--volume", "data:/data", "--", "sh", "-c", "echo from-runc > /data/from-runc")
		if code != 0 {
			t.Fatalf("runc writer: exit %d\n%s", code, out)
		}
		code, out, _ = run(t, "run", "--pool", "gvisor", "--volume", "data:/in:ro", "--", "sh", "-c", "cat /in/from-runc /in/ckpt/state")
		if code != 0 || !strings.Contains(out, "from-runc") || !strings.Contains(out, "from-gvisor") {
			t.Fatalf("gVisor reader: exit %d\n%s", code, out)
		}
	})

	t.Run("a read-only mount refuses writes under gVisor", func(t *testing.T) {
		code, out, _ := run(t, "run", "--pool", "gvisor", "--volume", "data:/data:ro", "--", "sh", "-c", "echo no > /data/nope")
		if code == 0 || !strings.Contains(strings.ToLower(out), "read-only") {
			t.Fatalf("write to a read-only volume under gVisor: exit %d\n%s", code, out)
		}
		code, out, _ = run(t, "run", "--volume", "data:/in:ro", "--", "sh", "-c", "test ! -e /in/nope && echo absent")
		if code != 0 || !strings.Contains(out, "absent") {
			t.Fatalf("the refused write reached the volume: exit %d\n%s", code, out)
		}
	})
}
