package e2e

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/levers9/levers9/controlplane/controlplanetest"
	"github.com/levers9/levers9/internal/testenv"
)

// shownApplied is an attempt's appliedSecurity as `task show -o json`
// prints it.
type shownApplied struct {
	Runtime              string   `json:"runtime"`
	RuntimeVersion       string   `json:"runtimeVersion"`
	Profile              string   `json:"profile"`
	SeccompMode          string   `json:"seccompMode"`
	SeccompProfileSha256 string   `json:"seccompProfileSha256"`
	Capabilities         []string `json:"capabilities"`
	NetRawDropped        bool     `json:"netRawDropped"`
	NoNewPrivileges      bool     `json:"noNewPrivileges"`
	MaskedPaths          []string `json:"maskedPaths"`
	ReadonlyPaths        []string `json:"readonlyPaths"`
	PathsNote            string   `json:"pathsNote"`
	ApparmorProfile      string   `json:"apparmorProfile"`
	ApparmorNote         string   `json:"apparmorNote"`
	EgressMode           string   `json:"egressMode"`
	Notes                []string `json:"notes"`
}

// appliedOf returns each attempt's applied security from `task show -o json`.
func appliedOf(t *testing.T, w *joinWorld, id string) []*shownApplied {
	t.Helper()
	var resp struct {
		Task struct {
			Attempts []struct {
				AppliedSecurity *shownApplied `json:"appliedSecurity"`
			} `json:"attempts"`
		} `json:"task"`
	}
	w.cliJSON(t, &resp, "task", "show", id)
	var out []*shownApplied
	for _, a := range resp.Task.Attempts {
		out = append(out, a.AppliedSecurity)
	}
	return out
}

// bundleSpec is what the test reads back from a running container's
// bundle: the spec the agent really handed to the runtime.
type bundleSpec struct {
	Process struct {
		Capabilities struct {
			Bounding []string `json:"bounding"`
		} `json:"capabilities"`
		NoNewPrivileges bool   `json:"noNewPrivileges"`
		ApparmorProfile string `json:"apparmorProfile"`
	} `json:"process"`
	Linux struct {
		Seccomp       json.RawMessage `json:"seccomp"`
		MaskedPaths   []string        `json:"maskedPaths"`
		ReadonlyPaths []string        `json:"readonlyPaths"`
	} `json:"linux"`
}

// waitBundle waits for a container bundle under any of roots and returns
// its spec and the sha256 of its linux.seccomp value as written.
func waitBundle(t *testing.T, roots []string) (bundleSpec, string) {
	t.Helper()
	var spec bundleSpec
	var sum string
	controlplanetest.Eventually(t, 90*time.Second, "a container bundle", func() bool {
		for _, root := range roots {
			files, _ := filepath.Glob(filepath.Join(root, "state", "containers", "bundles", "*", "config.json"))
			for _, f := range files {
				b, err := os.ReadFile(f)
				if err != nil || json.Unmarshal(b, &spec) != nil {
					continue
				}
				if len(spec.Linux.Seccomp) > 0 {
					h := sha256.Sum256(spec.Linux.Seccomp)
					sum = hex.EncodeToString(h[:])
				}
				return true
			}
		}
		return false
	})
	return spec, sum
}

// TestAppliedSecurity: a task on a runc pool with the strict defaults
// (hardened, seccomp enforce, NET_RAW dropped) reports what the runtime
// really got, read back from the container's bundle while it ran: seccomp
// enforce with the hash of the profile in config.json, NET_RAW dropped,
// the masked and read-only paths, AppArmor as this node has it, the egress
// mode; `task show` prints it in its own block.
func TestAppliedSecurity(t *testing.T) {
	w := setupTaskWorld(t)
	var roots []string
	for _, m := range w.runs {
		roots = append(roots, m.root)
	}
	r := w.start(t, "run", "--", "sh", "-c", "sleep 4; echo done")
	spec, sum := waitBundle(t, roots)
	if code := r.wait(t, 90*time.Second); code != 0 {
		so, se := r.out()
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, so, se)
	}
	ts := w.tasks(t)
	applied := appliedOf(t, w.joinWorld, ts[0].ID)
	raw, _ := json.MarshalIndent(applied, "", "  ")
	t.Logf("applied security:\n%s", raw)
	if len(applied) != 1 || applied[0] == nil {
		t.Fatalf("want one attempt with applied security, got %s", raw)
	}
	a := applied[0]
	if a.Runtime != "runc" || !strings.Contains(a.RuntimeVersion, "runc version") || a.Profile != "hardened" {
		t.Errorf("runtime %q %q profile %q, want runc with its version, hardened", a.Runtime, a.RuntimeVersion, a.Profile)
	}
	if a.SeccompMode != "enforce" || sum == "" || a.SeccompProfileSha256 != sum {
		t.Errorf("seccomp %q sha256 %q, want enforce and the bundle's %q", a.SeccompMode, a.SeccompProfileSha256, sum)
	}
	if !a.NetRawDropped || slices.Contains(a.Capabilities, "CAP_NET_RAW") || !slices.Equal(a.Capabilities, spec.Process.Capabilities.Bounding) {
		t.Errorf("NET_RAW dropped %v, capabilities %v; bundle's bounding set %v", a.NetRawDropped, a.Capabilities, spec.Process.Capabilities.Bounding)
	}
	if !a.NoNewPrivileges || !spec.Process.NoNewPrivileges {
		t.Errorf("noNewPrivileges %v, bundle %v", a.NoNewPrivileges, spec.Process.NoNewPrivileges)
	}
	if !slices.Contains(a.MaskedPaths, "/proc/kcore") || !slices.Equal(a.MaskedPaths, spec.Linux.MaskedPaths) ||
		!slices.Contains(a.ReadonlyPaths, "/proc/sys") || !slices.Equal(a.ReadonlyPaths, spec.Linux.ReadonlyPaths) || a.PathsNote != "" {
		t.Errorf("masked %v readonly %v (%q); bundle's %v %v", a.MaskedPaths, a.ReadonlyPaths, a.PathsNote, spec.Linux.MaskedPaths, spec.Linux.ReadonlyPaths)
	}
	if aa, _ := os.ReadFile("/sys/module/apparmor/parameters/enabled"); strings.TrimSpace(string(aa)) != "Y" {
		if a.ApparmorProfile != "" || spec.Process.ApparmorProfile != "" || a.ApparmorNote != "not loaded on this node" {
			t.Errorf("AppArmor %q (%q), bundle %q; want none, not loaded on this node", a.ApparmorProfile, a.ApparmorNote, spec.Process.ApparmorProfile)
		}
	} else if a.ApparmorProfile != spec.Process.ApparmorProfile {
		t.Errorf("AppArmor %q, bundle %q", a.ApparmorProfile, spec.Process.ApparmorProfile)
	}
	if want := w.in.Config.Worker.EffectiveSecurity("default").Egress.Mode; a.EgressMode != want {
		t.Errorf("egress mode %q, want the pool's %q", a.EgressMode, want)
	}
	out, _, err := w.cli(t, "task", "show", ts[0].ID)
	if err != nil || !strings.Contains(out, "Applied security (attempt 1)") || !strings.Contains(out, sum) ||
		!strings.Contains(out, "NET_RAW:") || !strings.Contains(out, "/proc/kcore") {
		t.Errorf("task show: %v\n%s", err, out)
	}
	t.Logf("task show:\n%s", out)
}

// checkRunscApplied runs a task on the runsc pool of TestRunscPoolAgentInRootNamespace
// (agent state under root) and checks what runsc really applies: seccomp
// (runsc installs the OCI profile inside the sandbox, --oci-seccomp) with
// the bundle's hash, NET_RAW dropped, and no masked or read-only paths or
// AppArmor, each with why.
func checkRunscApplied(t *testing.T, w *joinWorld, root string) {
	r := exec.Command(filepath.Join(bin, "levers9"), "run", "--pool", "gvisor", "--", "sleep", "4")
	r.Env = append(r.Environ(), "LEVERS9_HOME="+w.home)
	var out testenv.SyncBuffer
	r.Stdout, r.Stderr = &out, &out
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Wait() }()
	spec, sum := waitBundle(t, []string{root})
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("levers9 run: %v\n%s", err, out.String())
		}
	case <-time.After(3 * time.Minute):
		_ = r.Process.Kill()
		t.Fatalf("levers9 run did not exit within 3m\n%s", out.String())
	}
	var l struct {
		Tasks []struct {
			ID string `json:"id"`
		} `json:"tasks"`
	}
	w.cliJSON(t, &l, "task", "list")
	if len(l.Tasks) == 0 {
		t.Fatal("no tasks")
	}
	applied := appliedOf(t, w, l.Tasks[0].ID)
	raw, _ := json.MarshalIndent(applied, "", "  ")
	t.Logf("applied security under runsc:\n%s", raw)
	if len(applied) != 1 || applied[0] == nil {
		t.Fatalf("want one attempt with applied security, got %s", raw)
	}
	a := applied[0]
	if a.Runtime != "runsc" || !strings.Contains(a.RuntimeVersion, "runsc version") {
		t.Errorf("runtime %q %q", a.Runtime, a.RuntimeVersion)
	}
	if a.SeccompMode != "enforce" || sum == "" || a.SeccompProfileSha256 != sum {
		t.Errorf("seccomp %q sha256 %q, want enforce and the bundle's %q", a.SeccompMode, a.SeccompProfileSha256, sum)
	}
	if !a.NetRawDropped || slices.Contains(a.Capabilities, "CAP_NET_RAW") || !slices.Equal(a.Capabilities, spec.Process.Capabilities.Bounding) {
		t.Errorf("NET_RAW dropped %v, capabilities %v; bundle's %v", a.NetRawDropped, a.Capabilities, spec.Process.Capabilities.Bounding)
	}
	// The spec still lists paths (BuildSpec is runtime-neutral); runsc
	// ignores them, and the report says so instead of listing them.
	if len(spec.Linux.MaskedPaths) == 0 || len(a.MaskedPaths)+len(a.ReadonlyPaths) != 0 || !strings.Contains(a.PathsNote, "not applicable under runsc") {
		t.Errorf("masked %v readonly %v note %q (bundle lists %d masked)", a.MaskedPaths, a.ReadonlyPaths, a.PathsNote, len(spec.Linux.MaskedPaths))
	}
	if a.ApparmorProfile != "" || !strings.Contains(a.ApparmorNote, "runsc ignores it") {
		t.Errorf("AppArmor %q (%q)", a.ApparmorProfile, a.ApparmorNote)
	}
	if a.EgressMode != "enforce" && a.EgressMode != "observe" {
		t.Errorf("egress mode %q", a.EgressMode)
	}
}
