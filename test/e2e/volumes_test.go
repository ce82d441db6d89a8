package e2e

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/levers9/levers9/controlplane/auth"
	"github.com/levers9/levers9/controlplane/config"
	"github.com/levers9/levers9/controlplane/controlplanetest"
	"github.com/levers9/levers9/controlplane/store"
	"github.com/levers9/levers9/internal/ids"
	"github.com/levers9/levers9/internal/seaweed/seaweedtest"
	"github.com/levers9/levers9/internal/testenv"
)

type shownVolume struct {
	Name       string `json:"name"`
	Driver     string `json:"driver"`
	QuotaBytes string `json:"quotaBytes"`
	Stats      struct {
		Bytes string `json:"bytes"`
		Files string `json:"files"`
	} `json:"stats"`
	StatsError string   `json:"statsError"`
	UsedBy     []string `json:"usedBy"`
}

// TestVolumes: a real SeaweedFS (filer metadata in the stack's Postgres)
// behind `levers9 volume`, and tasks on the real agents mounting a volume
// with FUSE and runc: one task writes, later tasks read it back (on
// whichever machine they land), another workspace sees none of it (API and
// mount, on the same machines), a read-only mount refuses writes, a mount
// over /proc is refused under enforce and reported under log, and a volume
// a task uses cannot be deleted.
func TestVolumes(t *testing.T) {
	if _, err := os.Stat("/dev/fuse"); err != nil {
		testenv.Missing(t, "/dev/fuse: %v", err)
	}
	testenv.RequireBinary(t, "fusermount3")
	weed := seaweedtest.Bin(t)
	// The agents' join scripts inherit the test's environment: this is how
	// they find weed (levers9-agent --weed defaults to it).
	t.Setenv(seaweedtest.BinEnv, weed)
	var sw *seaweedtest.Env
	w := setupTaskWorldWith(t, func(c *config.Config, _ *taskWorld) {
		dir := t.TempDir()
		if err := os.Chmod(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		// On the first box's host address, which both boxes reach.
		sw = seaweedtest.StartWith(t, weed, env.PG, dir, c.Controlplane.PublicHost)
		c.Volumes.SeaweedFS.FilerAddr = sw.Cluster.FilerAddr()
		c.Volumes.SeaweedFS.FilerURL = sw.Cluster.FilerURL()
		c.Volumes.SeaweedFS.SecurityDir = sw.Cluster.SecurityDir()
		// Log, to see both modes: a task may ask for enforce.
		c.Worker.VolumeMountValidation = "log"
		// Parked: a pool no machine joins, where tasks wait.
		c.Worker.Pools["parked"] = config.Pool{Runtime: "runc"}
		// Shared, so a second workspace's tasks run on the same machines.
		def := c.Worker.Pools["default"]
		def.Shared = true
		c.Worker.Pools["default"] = def
	})

	if out, errOut, err := w.cli(t, "volume", "create", "data", "--quota", "64M"); err != nil || !strings.Contains(out, "volume data created") {
		t.Fatalf("volume create: %v\n%s\n%s", err, out, errOut)
	}
	if _, errOut, err := w.cli(t, "volume", "create", "Bad_Name"); err == nil {
		t.Fatal("volume create accepted a bad name")
	} else {
		t.Logf("bad name refused: %s", strings.TrimSpace(errOut))
	}

	t.Run("a task writes, later tasks read it back", func(t *testing.T) {
		r := w.start(t, "run", "--volume", "data:/data", "--", "sh", "-c", "mkdir -p /data/ckpt && echo step-1 > /data/ckpt/state && echo wrote")
		if code := r.wait(t, 120*time.Second); code != 0 {
			so, se := r.out()
			t.Fatalf("writer exit %d\nstdout:\n%s\nstderr:\n%s", code, so, se)
		}
		// Several readers, so both machines get to mount it.
		machines := map[string]bool{}
		for i := range 4 {
			r := w.start(t, "run", "--volume", "data:/in:ro", "--", "cat", "/in/ckpt/state")
			code := r.wait(t, 120*time.Second)
			so, se := r.out()
			if code != 0 || !strings.Contains(so, "step-1") {
				t.Fatalf("reader %d: exit %d\nstdout:\n%s\nstderr:\n%s", i, code, so, se)
			}
			ts := w.tasks(t)
			if len(ts) > 0 && len(ts[0].Attempts) > 0 {
				machines[ts[0].Attempts[len(ts[0].Attempts)-1].MachineID] = true
			}
		}
		t.Logf("readers ran on %d machine(s)", len(machines))
		var v shownVolume
		w.cliJSON(t, &v, "volume", "show", "data")
		if v.Stats.Files != "1" || v.Stats.Bytes != "7" || v.QuotaBytes != "67108864" {
			t.Fatalf("volume show: %+v", v)
		}
	})

	t.Run("another workspace sees none of it, through the API or a mount", func(t *testing.T) {
		tok := seedWorkspace(t, w.in.Config.Database.Postgres.ConnString(), "other")
		asOther := func(args ...string) (string, string, error) {
			cmd := exec.Command(filepath.Join(bin, "levers9"), args...)
			cmd.Env = append(os.Environ(), "LEVERS9_HOME="+w.home, "LEVERS9_TOKEN="+tok)
			var out, errb bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &errb
			err := cmd.Run()
			return out.String(), errb.String(), err
		}
		if out, errOut, err := asOther("volume", "list", "-o", "json"); err != nil || strings.Contains(out, "data") {
			t.Fatalf("the other workspace's volume list: %v\n%s\n%s", err, out, errOut)
		}
		for _, args := range [][]string{
			{"volume", "show", "data"}, {"volume", "ls", "data"}, {"volume", "get", "data", "/ckpt/state", "-"},
			{"volume", "delete", "data"}, {"run", "--volume", "data:/d", "--", "true"},
		} {
			if out, errOut, err := asOther(args...); err == nil || strings.Contains(out, "step-1") {
				t.Fatalf("the other workspace: %v: %v\n%s\n%s", args, err, out, errOut)
			}
		}
		// Its own volume of the same name is another directory.
		if _, errOut, err := asOther("volume", "create", "data"); err != nil {
			t.Fatalf("the other workspace's volume create: %v\n%s", err, errOut)
		}
		out, errOut, err := asOther("run", "--volume", "data:/d", "--", "sh", "-c",
			"test ! -e /d/ckpt/state && echo other-side > /d/other && echo isolated")
		if err != nil || !strings.Contains(out, "isolated") {
			t.Fatalf("the other workspace's task: %v\n%s\n%s", err, out, errOut)
		}
		r := w.start(t, "run", "--volume", "data:/data:ro", "--", "sh", "-c", "test ! -e /data/other && cat /data/ckpt/state")
		code := r.wait(t, 120*time.Second)
		so, se := r.out()
		if code != 0 || !strings.Contains(so, "step-1") {
			t.Fatalf("the first workspace after the other wrote: exit %d\nstdout:\n%s\nstderr:\n%s", code, so, se)
		}
	})

	t.Run("killed mid-write, the retry on the other machine finds the first attempt's files", func(t *testing.T) {
		// The first attempt ends by itself soon after its agent is killed
		// (as in TestTasksEndToEnd), so the restarted agent finds an exited
		// container to clean up; the retry comes once the machine is lost.
		r := w.start(t, "run", "--retries", "1", "--volume", "data:/data", "--", "sh", "-c",
			`if [ -f /data/run/first ]; then echo "retry found: $(cat /data/run/first)"; exit 0; fi; `+
				`mkdir -p /data/run && echo attempt-1-was-here > /data/run/first && echo wrote; sleep 8`)
		testenv.Eventually(t, 120*time.Second, "the first attempt wrote", func() bool {
			so, _ := r.out()
			return strings.Contains(so, "wrote")
		})
		first := w.tasks(t)[0]
		writer := first.Attempts[len(first.Attempts)-1].MachineID
		w.kill(t, writer)
		code := r.wait(t, 180*time.Second)
		so, se := r.out()
		if code != 0 || !strings.Contains(so, "retry found: attempt-1-was-here") {
			t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, so, se)
		}
		last := w.tasks(t)[0]
		reader := last.Attempts[len(last.Attempts)-1].MachineID
		if len(last.Attempts) < 2 || reader == writer {
			t.Fatalf("attempts %+v: want a second attempt on another machine than %s", last.Attempts, writer)
		}
		t.Logf("attempt 1 wrote on %s, attempt %d read on %s", writer, len(last.Attempts), reader)
		// The killed agent comes back; its start clears whatever mount
		// the dead one left.
		w.startAgent(t, w.runs[writer])
		controlplanetest.Eventually(t, 60*time.Second, "the killed machine online again", func() bool {
			for _, m := range w.machines(t) {
				if m.ID == writer && m.State == "MACHINE_STATE_ONLINE" {
					return true
				}
			}
			return false
		})
		controlplanetest.Eventually(t, 60*time.Second, "the killed agent's leftovers cleaned up", func() bool {
			b, _ := os.ReadFile("/proc/self/mountinfo")
			return !strings.Contains(string(b), w.runs[writer].root)
		})
	})

	t.Run("a read-only mount refuses writes", func(t *testing.T) {
		r := w.start(t, "run", "--volume", "data:/data:ro", "--", "sh", "-c", "echo no > /data/nope")
		code := r.wait(t, 120*time.Second)
		so, se := r.out()
		if code == 0 || !strings.Contains(strings.ToLower(so+se), "read-only") {
			t.Fatalf("write to a read-only volume: exit %d\nstdout:\n%s\nstderr:\n%s", code, so, se)
		}
	})

	t.Run("a mount over /proc is refused under enforce and reported under log", func(t *testing.T) {
		// The stack's pools are at log; a task may ask for enforce.
		before := len(w.tasks(t))
		_, errOut, err := w.cli(t, "run", "--env", "LEVERS9_VOLUME_MOUNT_VALIDATION=enforce", "--volume", "data:/proc", "--", "true")
		if err == nil || !strings.Contains(errOut, "volume data at /proc: over /proc") || !strings.Contains(errOut, "enforce") {
			t.Fatalf("--volume data:/proc under enforce: %v\n%s", err, errOut)
		}
		if n := len(w.tasks(t)); n != before {
			t.Fatalf("a refused task was stored: %d tasks, %d before", n, before)
		}
		if _, errOut, err := w.cli(t, "run", "--volume", "nope:/data", "--", "true"); err == nil || !strings.Contains(errOut, "nope") {
			t.Fatalf("an unknown volume: %v\n%s", err, errOut)
		}

		// Under log: stored with its finding, which task show and the
		// pool's security report carry. runc itself will not bind over
		// /proc, so it goes to a pool without machines and is cancelled.
		out, errOut, err := w.cli(t, "run", "--detach", "--pool", "parked", "--volume", "data:/proc", "--", "true")
		if err != nil {
			t.Fatalf("--volume data:/proc under log: %v\n%s", err, errOut)
		}
		id := strings.TrimSpace(out)
		var shown struct {
			Task struct {
				MountFindings []struct{ Volume, Path, Reason string } `json:"mountFindings"`
			} `json:"task"`
		}
		w.cliJSON(t, &shown, "task", "show", id)
		if _, errOut, err := w.cli(t, "task", "cancel", id); err != nil {
			t.Fatalf("task cancel %s: %v\n%s", id, err, errOut)
		}
		if f := shown.Task.MountFindings; len(f) != 1 || f[0].Volume != "data" || f[0].Path != "/proc" || f[0].Reason != "over /proc" {
			t.Fatalf("task show %s: findings %+v", id, f)
		}

		// A path the runtime can bind under log: the task runs, its
		// stream says what enforce would refuse.
		r := w.start(t, "run", "--volume", "data:/etc/data", "--", "sh", "-c", "echo seen > /etc/data/etc-mark && echo ran")
		code := r.wait(t, 120*time.Second)
		so, se := r.out()
		if code != 0 || !strings.Contains(so, "ran") || !strings.Contains(se, "volume data at /etc/data: over /etc") {
			t.Fatalf("--volume data:/etc/data under log: exit %d\nstdout:\n%s\nstderr:\n%s", code, so, se)
		}

		type report struct {
			Mounts struct {
				Mode              string `json:"mode"`
				TasksWithVolumes  int    `json:"tasksWithVolumes"`
				TasksWithFindings int    `json:"tasksWithFindings"`
				Findings          []struct {
					TaskID  string                `json:"taskId"`
					Finding struct{ Path string } `json:"finding"`
				} `json:"findings"`
			} `json:"mounts"`
		}
		var rep report
		w.cliJSON(t, &rep, "security", "report", "--pool", "default")
		m := rep.Mounts
		if m.Mode != "log" || m.TasksWithFindings != 1 || m.TasksWithVolumes < 3 || len(m.Findings) != 1 || m.Findings[0].Finding.Path != "/etc/data" {
			t.Fatalf("security report mounts, pool default: %+v", m)
		}
		var parked report
		w.cliJSON(t, &parked, "security", "report", "--pool", "parked")
		if m := parked.Mounts; m.TasksWithFindings != 1 || len(m.Findings) != 1 || m.Findings[0].TaskID != id {
			t.Fatalf("security report mounts, pool parked: %+v", m)
		}
		text, _, err := w.cli(t, "security", "report", "--pool", "default")
		if err != nil || !strings.Contains(text, "volume mounts safe to enforce: no") {
			t.Fatalf("security report: %v\n%s", err, text)
		}
	})

	t.Run("delete is refused while a task uses it", func(t *testing.T) {
		r := w.start(t, "run", "--volume", "data:/data", "--", "sh", "-c", "echo started; sleep 6")
		testenv.Eventually(t, 120*time.Second, "the task started", func() bool {
			so, _ := r.out()
			return strings.Contains(so, "started")
		})
		_, errOut, err := w.cli(t, "volume", "delete", "data")
		if err == nil || !strings.Contains(errOut, "used by") {
			t.Fatalf("delete while used: %v\n%s", err, errOut)
		}
		// While it is mounted: no process's argv holds a credential.
		checkNoSecretInArgv(t, sw)
		if code := r.wait(t, 60*time.Second); code != 0 {
			t.Fatalf("the task exited %d", code)
		}
		if out, errOut, err := w.cli(t, "volume", "delete", "data"); err != nil {
			t.Fatalf("delete once unused: %v\n%s\n%s", err, out, errOut)
		}
		var list struct {
			Volumes []shownVolume `json:"volumes"`
		}
		w.cliJSON(t, &list, "volume", "list")
		if len(list.Volumes) != 0 {
			t.Fatalf("volumes after delete: %+v", list.Volumes)
		}
	})

	t.Run("no volume stays mounted once its tasks ended, the killed agent's included", func(t *testing.T) {
		for _, m := range w.runs {
			deadline := time.Now().Add(30 * time.Second)
			for {
				b, _ := os.ReadFile("/proc/self/mountinfo")
				var left []string
				for _, line := range strings.Split(string(b), "\n") {
					// FUSE mounts only: the overlay of the killed agent's
					// attempt is the task side's to clean up, not volumes'.
					if strings.Contains(line, m.root) && strings.Contains(line, " - fuse") {
						left = append(left, line)
					}
				}
				if len(left) == 0 {
					break
				}
				if time.Now().After(deadline) {
					ps, _ := exec.Command("pgrep", "-af", "weed").Output()
					for i, out := range w.agentLogs {
						t.Logf("agent run %d log (volume lines):", i)
						for _, l := range strings.Split(out.String(), "\n") {
							if strings.Contains(l, "volume") {
								t.Log(l)
							}
						}
					}
					t.Fatalf("mounts left under %s:\n%s\nweed processes:\n%s", m.root, strings.Join(left, "\n"), ps)
				}
				time.Sleep(200 * time.Millisecond)
			}
		}
	})
}

// seedWorkspace makes another workspace with an admin token straight in
// the store (no API creates workspaces) and returns the token.
func seedWorkspace(t *testing.T, pg, name string) string {
	t.Helper()
	ctx := context.Background()
	st, err := store.Open(ctx, pg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ws := store.Workspace{ID: ids.New("ws"), Name: name, CreatedAt: time.Now()}
	if err := st.CreateWorkspace(ctx, ws); err != nil {
		t.Fatal(err)
	}
	id, tok, hash := auth.Mint()
	if err := st.CreateToken(ctx, store.Token{ID: id, WorkspaceID: ws.ID, Name: "admin", Role: store.RoleAdmin, Hash: hash, CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	return tok
}

// checkNoSecretInArgv reads every process's argv (/proc/*/cmdline) while a
// volume is mounted: none may hold the filer's Postgres password or any
// of the cluster's keys, and the weed mount process has its credentials
// in 0600 files in its working directory instead.
func checkNoSecretInArgv(t *testing.T, sw *seaweedtest.Env) {
	t.Helper()
	creds, err := sw.Security.MountCredentials()
	if err != nil {
		t.Fatal(err)
	}
	caKey, err := os.ReadFile(filepath.Join(sw.Security.Dir, "ca.key"))
	if err != nil {
		t.Fatal(err)
	}
	pem := func(b []byte) string { return strings.Split(string(b), "\n")[1] } // a line of the key itself
	secrets := map[string]string{
		"the Postgres password": sw.PG.Password, "the volume write key": sw.Security.VolumeWriteKey,
		"the volume read key": sw.Security.VolumeReadKey, "the filer write key": sw.Security.FilerWriteKey,
		"the filer read key": sw.Security.FilerReadKey, "the mount's client key": pem(creds.KeyPEM), "the CA key": pem(caKey),
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	var mounts int
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil || len(b) == 0 {
			continue // gone, or a kernel thread
		}
		for what, s := range secrets {
			if strings.Contains(string(b), s) {
				t.Errorf("%s: argv holds %s", p, what)
			}
		}
		args := strings.Split(string(b), "\x00")
		if !strings.HasSuffix(args[0], "weed") || len(args) < 2 || args[1] != "mount" {
			continue
		}
		mounts++
		cwd, err := os.Readlink(filepath.Join(filepath.Dir(p), "cwd"))
		if err != nil {
			t.Fatal(err)
		}
		if st, err := os.Stat(filepath.Join(cwd, "security.toml")); err != nil || st.Mode().Perm() != 0o600 {
			t.Errorf("weed mount %s: security.toml in its working directory: %v, want 0600", p, err)
		}
	}
	if mounts == 0 {
		t.Fatal("no weed mount process while a task uses the volume")
	}
	t.Logf("checked the argv of %d processes, %d of them weed mount: no credential", len(procs), mounts)
}
