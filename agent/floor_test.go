package agent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/levers9/levers9/agent/taskrun"
	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/controlplane/config"
	"github.com/levers9/levers9/controlplane/controlplanetest"
	"github.com/levers9/levers9/egress"
	"github.com/levers9/levers9/enroll"
	"github.com/levers9/levers9/internal/testenv"
	"github.com/levers9/levers9/sandbox"
	"github.com/levers9/levers9/sandbox/image/build"
	"github.com/levers9/levers9/sandbox/image/imagetest"
	"github.com/levers9/levers9/tunnel"
)

func TestCheckFloor(t *testing.T) {
	t.Parallel()
	full := enroll.Floor{Profile: "hardened", Seccomp: "enforce", Egress: "enforce"}
	task := func(profile, seccomp, egressMode string, env ...string) taskrun.Task {
		tk := taskrun.Task{ID: "t_1", Attempt: 1, Env: env,
			Security: sandbox.Security{Profile: sandbox.Profile(profile), Seccomp: sandbox.SeccompMode(seccomp)}}
		if egressMode != "" {
			tk.Network = &egress.SecurityConfig{Egress: egress.EgressConfig{Mode: egress.Mode(egressMode)}}
		}
		return tk
	}
	for _, tc := range []struct {
		name  string
		floor enroll.Floor
		task  taskrun.Task
		want  []string // substrings of the refusal; nil: accepted
	}{
		{"no floor takes anything", enroll.Floor{}, task("legacy", "off", "observe"), nil},
		{"at the floor", full, task("hardened", "enforce", "enforce"), nil},
		{"all below", full, task("legacy", "log", "observe"),
			[]string{`profile "legacy" is below this machine's floor "hardened"`, `seccomp "log" is below this machine's floor "enforce"`,
				`egress "observe" is below this machine's floor "enforce"`}},
		{"the task's own tightening counts", full,
			task("legacy", "off", "enforce", sandbox.EnvSecurityProfile+"=hardened", sandbox.EnvSeccomp+"=enforce"), nil},
		{"a loosening request does not lift it", enroll.Floor{Profile: "hardened"},
			task("legacy", "enforce", "enforce", sandbox.EnvSecurityProfile+"=legacy"), []string{`profile "legacy"`}},
		{"no egress mode is the node's observe", enroll.Floor{Egress: "enforce"}, task("hardened", "enforce", ""), []string{`egress "observe"`}},
		{"only the floor's settings count", enroll.Floor{Seccomp: "log"}, task("legacy", "log", "observe"), nil},
	} {
		err := checkFloor(tc.floor, tc.task)
		if tc.want == nil {
			if err != nil {
				t.Errorf("%s: refused: %v", tc.name, err)
			}
			continue
		}
		if err == nil {
			t.Errorf("%s: accepted", tc.name)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %v lacks %q", tc.name, err, w)
			}
		}
	}
}

func TestFloorIsSavedInTheStateDir(t *testing.T) {
	t.Parallel()
	st := State{Dir: t.TempDir()}
	f, err := st.resolveFloor(enroll.Floor{Profile: "hardened", Egress: "enforce"})
	if err != nil || f != (enroll.Floor{Profile: "hardened", Egress: "enforce"}) {
		t.Fatalf("first: %+v %v", f, err)
	}
	// A restart without flags keeps it; a flag changes only its setting.
	if f, err = st.resolveFloor(enroll.Floor{}); err != nil || f != (enroll.Floor{Profile: "hardened", Egress: "enforce"}) {
		t.Fatalf("restart: %+v %v", f, err)
	}
	if f, err = st.resolveFloor(enroll.Floor{Profile: "legacy", Seccomp: "log"}); err != nil || f != (enroll.Floor{Profile: "legacy", Seccomp: "log", Egress: "enforce"}) {
		t.Fatalf("changed: %+v %v", f, err)
	}
	if fi, err := os.Stat(st.path(floorFile)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("%s: %v %v", floorFile, fi, err)
	}
	if _, err := st.resolveFloor(enroll.Floor{Seccomp: "strict", Egress: "block"}); err == nil ||
		!strings.Contains(err.Error(), `--min-seccomp: "strict"`) || !strings.Contains(err.Error(), `--min-egress: "block"`) {
		t.Errorf("bad flags: %v", err)
	}
	os.WriteFile(st.path(floorFile), []byte(`{"profile":"paranoid"}`), 0o600)
	if _, err := st.resolveFloor(enroll.Floor{}); err == nil || !strings.Contains(err.Error(), floorFile) {
		t.Errorf("bad saved floor: %v", err)
	}
}

// TestFloorRefusesADowngrade is the attack: a controlplane (compromised,
// or misconfigured) pushes tasks to a machine with weaker security than
// the machine's operator set as its floor. The task fails as refused by
// the machine and nothing starts. The same agent, restarted without flags
// (the floor comes from its state directory), runs the tasks of a
// controlplane whose pool is at the floor.
func TestFloorRefusesADowngrade(t *testing.T) {
	t.Parallel()
	testenv.RequireRoot(t)
	testenv.RequireBinary(t, "runc")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rb := make([]byte, 2)
	_, _ = rand.Read(rb)
	prefix := "l9f" + hex.EncodeToString(rb)

	reg := imagetest.StartRegistry(t, imagetest.RegistryOptions{})
	img, err := build.BuildBusybox(ctx, reg.Host, "l9f/busybox", "test", nil, build.Options{})
	if err != nil {
		t.Fatal(err)
	}
	b := setupJoinWith(t, func(c *config.Config) {
		c.Worker.DefaultImage = img.Ref
		c.Worker.ContainerSecurity = config.ContainerSecurity{Profile: "legacy", Seccomp: "log", Egress: config.Egress{Mode: "observe"}}
		c.WithDefaults()
	})
	in, admin, cfg := b.in, b.ctx, b.in.Config
	machines, tasksAPI := v1.NewMachineServiceClient(in.Conn), v1.NewTaskServiceClient(in.Conn)
	created, err := machines.CreateMachine(admin, &v1.CreateMachineRequest{Pool: "default"})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	os.WriteFile(tokenFile, []byte(created.JoinToken), 0o600)
	state := State{Dir: filepath.Join(dir, "state")}
	if _, err := Join(ctx, JoinOptions{Controlplane: in.Server.GRPCAddr(), CAFile: b.caFile, TokenFile: tokenFile, State: state, Version: "t"}); err != nil {
		t.Fatal(err)
	}
	node := testNode{prefix: prefix, sbState: filepath.Join("/run", prefix+"-test"), imageRoot: filepath.Join(t.TempDir(), "images"),
		registry: reg.Host, state: state}
	logs := &controlplanetest.Logs{}
	start := func(o RunOptions) (*Agent, *taskrun.Runner) {
		t.Helper()
		log := slog.New(slog.NewJSONHandler(logs, nil))
		o.State, o.Version, o.Log, o.HeartbeatInterval = state, "t", log, 200*time.Millisecond
		o.Client = tunnel.ClientConfig{BackoffBase: 100 * time.Millisecond, BackoffMax: 500 * time.Millisecond}
		o.Runner = newTestRunner(t, node, log)
		return startedAgent(t, o), o.Runner
	}
	online := func(in *controlplanetest.Instance, admin context.Context) {
		t.Helper()
		controlplanetest.Eventually(t, 60*time.Second, "machine online with inventory", func() bool {
			m, err := v1.NewMachineServiceClient(in.Conn).GetMachine(admin, &v1.GetMachineRequest{Id: created.Machine.Id})
			return err == nil && m.Machine.State == v1.MachineState_MACHINE_STATE_ONLINE && m.Machine.GetInventory().GetCpus() > 0
		})
	}
	finished := func(api v1.TaskServiceClient, admin context.Context, script string) *v1.Task {
		t.Helper()
		resp, err := api.SubmitTask(admin, &v1.SubmitTaskRequest{Spec: &v1.TaskSpec{Command: []string{"/bin/sh", "-c", script}}})
		if err != nil {
			t.Fatal(err)
		}
		var task *v1.Task
		controlplanetest.Eventually(t, 60*time.Second, "task "+resp.Task.Id+" to end", func() bool {
			got, err := api.GetTask(admin, &v1.GetTaskRequest{Id: resp.Task.Id})
			if err != nil {
				return false
			}
			task = got.Task
			s := task.State
			return s == v1.TaskState_TASK_STATE_SUCCEEDED || s == v1.TaskState_TASK_STATE_FAILED || s == v1.TaskState_TASK_STATE_TIMED_OUT
		})
		return task
	}

	a, runner := start(RunOptions{Floor: enroll.Floor{Profile: "hardened", Seccomp: "enforce", Egress: "enforce"}})
	online(in, admin)
	task := finished(tasksAPI, admin, "echo ran; touch /ran")
	if task.State != v1.TaskState_TASK_STATE_FAILED || len(task.Attempts) != 1 {
		t.Fatalf("a task below the floor: %v, attempts %v", task.State, task.Attempts)
	}
	msg := task.Attempts[0].Message
	for _, want := range []string{"refused by machine " + created.Machine.Id,
		`profile "legacy" is below this machine's floor "hardened"`, `seccomp "log" is below this machine's floor "enforce"`,
		`egress "observe" is below this machine's floor "enforce"`} {
		if !strings.Contains(msg, want) {
			t.Errorf("attempt message %q lacks %q", msg, want)
		}
	}
	// Nothing ran: no rootfs, no container, no attempt record.
	for _, p := range []string{filepath.Join(node.imageRoot, "tasks", task.Id+".1"), filepath.Join(node.sbState, prefix+"-"+task.Id+".1"),
		filepath.Join(state.Dir, "attempts", task.Id+".1.json")} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s exists (stat: %v): something started", p, err)
		}
	}
	if lost, err := runner.Reconcile(ctx); err != nil || len(lost) != 0 {
		t.Errorf("reconcile: %v, leftovers %+v", err, lost)
	}
	if refused := logs.Find("below this machine's security floor"); len(refused) != 1 || refused[0]["audit"] != true ||
		refused[0]["task_id"] != task.Id || refused[0]["floor"] != "profile=hardened seccomp=enforce egress=enforce" {
		t.Errorf("agent log of the refusal: %v", refused)
	}
	a.Stop()

	// The controlplane comes back with the pool at the floor (the shipped
	// defaults); the agent starts again without flags.
	in.Server.Stop()
	cfg.Worker.ContainerSecurity = config.ContainerSecurity{}
	cfg.WithDefaults()
	in2 := controlplanetest.Start(t, cfg, true)
	admin2 := admin // the token is in Postgres
	a, _ = start(RunOptions{})
	if a.floor != (enroll.Floor{Profile: "hardened", Seccomp: "enforce", Egress: "enforce"}) {
		t.Fatalf("floor after a restart without flags: %+v", a.floor)
	}
	online(in2, admin2)
	task = finished(v1.NewTaskServiceClient(in2.Conn), admin2, "echo ran")
	if task.State != v1.TaskState_TASK_STATE_SUCCEEDED {
		t.Fatalf("a task at the floor: %v %q, attempts %v", task.State, task.Message, task.Attempts)
	}
}
