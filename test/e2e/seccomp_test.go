package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/levers9/levers9/controlplane/config"
	"github.com/levers9/levers9/controlplane/controlplanetest"
	"github.com/levers9/levers9/internal/devstack"
	"github.com/levers9/levers9/internal/testenv"
	"github.com/levers9/levers9/sandbox/image/build"
)

// TestSeccompLogMode runs, on a pool whose seccomp is log, a task that
// makes a syscall Docker's profile refuses (add_key, from the sandbox's
// keyctl probe). Log mode lets it through, so the task succeeds; the
// agent reads the kernel's audit record, attributes it to the task and
// reports it; `task show` (text and -o json) lists the syscall with a
// count, and the pool's `security report` names it with the task. A task
// that makes no such syscall is observed and lists none.
func TestSeccompLogMode(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireBinary(t, "runc")
	var registry string
	w := setupJoinWorldWith(t, func(c *config.Config) {
		if c.Worker.Pools == nil {
			c.Worker.Pools = map[string]config.Pool{}
		}
		c.Worker.Pools["observe"] = config.Pool{Runtime: "runc", Security: config.ContainerSecurity{Seccomp: "log"}}
		reg, err := devstack.StartRegistry(context.Background(), filepath.Join(t.TempDir(), "registry"), c.Controlplane.PublicHost, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = reg.Stop() })
		registry = reg.Addr()
		res, err := build.BuildBusybox(context.Background(), reg.Addr(), "levers9/probe", "e2e", probeFiles(t), build.Options{Insecure: true})
		if err != nil {
			t.Fatal(err)
		}
		c.Worker.DefaultImage = res.Ref
	})
	out, errOut, err := w.cli(t, "machine", "create", "--pool", "observe", "--name", "observer")
	if err != nil {
		t.Fatalf("machine create: %v %s", err, errOut)
	}
	id := regexp.MustCompile(`machine (m_[a-z2-7]+)`).FindStringSubmatch(out)[1]
	_, agentOut := w.runScript(t, filepath.Join(w.home, "machines", id+".sh"), t.TempDir(), "--", "--insecure-registries", registry)
	controlplanetest.Eventually(t, 60*time.Second, "machine online", func() bool {
		for _, m := range w.machines(t) {
			if m.ID == id && m.State == "MACHINE_STATE_ONLINE" {
				return true
			}
		}
		return false
	})

	runTask := func(t *testing.T, args ...string) string {
		t.Helper()
		out, errOut, err := w.cli(t, append([]string{"run", "--pool", "observe"}, args...)...)
		if err != nil {
			t.Fatalf("run %v: %v\nstdout:\n%s\nstderr:\n%s\nagent:\n%s", args, err, out, errOut, agentOut)
		}
		var l struct {
			Tasks []struct {
				ID string `json:"id"`
			} `json:"tasks"`
		}
		w.cliJSON(t, &l, "task", "list") // newest first
		if len(l.Tasks) == 0 {
			t.Fatal("task list is empty")
		}
		return l.Tasks[0].ID
	}
	type shown struct {
		Task struct {
			SeccompLogged []struct {
				Syscall string `json:"syscall"`
				Count   string `json:"count"`
			} `json:"seccompLogged"`
		} `json:"task"`
	}

	// The probe lingers after the syscall: the agent maps the record's
	// pid to its container through /proc, so the process must still be
	// there when the kernel's record is read.
	refused := runTask(t, "--env", "PROBE_LINGER=1", "--", "/probe", "keyctl")
	clean := runTask(t, "--", "true")

	var s shown
	w.cliJSON(t, &s, "task", "show", refused)
	raw, _ := json.Marshal(s)
	if len(s.Task.SeccompLogged) == 0 || s.Task.SeccompLogged[0].Syscall != "add_key" || s.Task.SeccompLogged[0].Count == "0" {
		t.Fatalf("task show -o json: seccompLogged %s, want add_key with a count\nagent:\n%s", raw, agentOut)
	}
	text, _, err := w.cli(t, "task", "show", refused)
	if err != nil || !strings.Contains(text, "Seccomp (log mode)") || !regexp.MustCompile(`add_key\s+[1-9]`).MatchString(text) {
		t.Fatalf("task show: %v\n%s", err, text)
	}
	t.Logf("task show:\n%s", text)

	var c shown
	w.cliJSON(t, &c, "task", "show", clean)
	if len(c.Task.SeccompLogged) != 0 {
		t.Errorf("a task that made no refused syscall lists %+v", c.Task.SeccompLogged)
	}

	var rep struct {
		Seccomp struct {
			Mode          string `json:"mode"`
			TasksObserved int    `json:"tasksObserved"`
			SafeToEnforce bool   `json:"safeToEnforce"`
			Syscalls      []struct {
				Syscall string   `json:"syscall"`
				Count   string   `json:"count"`
				Tasks   int      `json:"tasks"`
				TaskIDs []string `json:"taskIds"`
			} `json:"syscalls"`
		} `json:"seccomp"`
	}
	w.cliJSON(t, &rep, "security", "report", "--pool", "observe")
	raw, _ = json.Marshal(rep)
	sc := rep.Seccomp
	if sc.Mode != "log" || sc.TasksObserved != 2 || sc.SafeToEnforce || len(sc.Syscalls) == 0 ||
		sc.Syscalls[0].Syscall != "add_key" || sc.Syscalls[0].Tasks != 1 || !slices.Equal(sc.Syscalls[0].TaskIDs, []string{refused}) {
		t.Fatalf("security report -o json: %s", raw)
	}
	text, _, err = w.cli(t, "security", "report", "--pool", "observe")
	if err != nil || !strings.Contains(text, "seccomp safe to enforce: no") ||
		!regexp.MustCompile(fmt.Sprintf(`add_key\s+[1-9][0-9]*\s+1\s+%s`, refused)).MatchString(text) {
		t.Fatalf("security report: %v\n%s", err, text)
	}
	t.Logf("security report:\n%s", text)
}
