package cli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

func TestMachineCreateWritesPrivateScript(t *testing.T) {
	t.Parallel()
	b := adminCLI(t)

	out, errOut, code := b.run(t, "", nil, "machine", "create", "--pool", "default", "--name", "box-1")
	if code != 0 {
		t.Fatalf("machine create: %s", errOut)
	}
	id := regexp.MustCompile(`machine (m_[a-z2-7]+)`).FindStringSubmatch(out)
	if id == nil {
		t.Fatalf("no machine id in %q", out)
	}
	path := filepath.Join(b.home, "machines", id[1]+".sh")
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("script %s: %v %v", path, st, err)
	}
	script, _ := os.ReadFile(path)
	tok := regexp.MustCompile(`l9join_[a-z2-7]{16}_[a-z2-7]{52}`).FindString(string(script))
	if tok == "" {
		t.Fatal("script lacks the token")
	}
	if strings.Contains(out+errOut, tok) || strings.Contains(out, tok[len(tok)-52:]) {
		t.Error("the printed command shows the token")
	}
	if !strings.Contains(out, path) {
		t.Error("the file's path is not printed")
	}

	out, _, code = b.run(t, "", nil, "machine", "list", "-o", "json")
	var list struct {
		Machines []struct{ ID, Name, State, Pool string }
	}
	if code != 0 || json.Unmarshal([]byte(out), &list) != nil || len(list.Machines) != 1 || list.Machines[0].State != "MACHINE_STATE_PENDING" {
		t.Fatalf("machine list -o json: %s", out)
	}
	out, _, code = b.run(t, "", nil, "machine", "show", id[1])
	if code != 0 || !strings.Contains(out, "pending") || !strings.Contains(out, "Join token expires") {
		t.Errorf("machine show: %s", out)
	}
	out, _, code = b.run(t, "", nil, "pool", "list")
	if code != 0 || !regexp.MustCompile(`default\s+1\s+0`).MatchString(out) {
		t.Errorf("pool list: %s", out)
	}
	if _, errOut, code = b.run(t, "", nil, "machine", "delete", id[1]); code != 0 {
		t.Fatal(errOut)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Error("the join script outlives the machine")
	}
	if _, errOut, code = b.run(t, "", nil, "machine", "create", "--pool", "nope"); code == 0 || !strings.Contains(errOut, "not declared") {
		t.Errorf("unknown pool: %s", errOut)
	}

	// A floor goes into the script the CLI writes; a bad one creates nothing.
	if _, errOut, code = b.run(t, "", nil, "machine", "create", "--pool", "default", "--min-seccomp", "strict"); code == 0 ||
		!strings.Contains(errOut, `--min-seccomp: "strict" is not one of off, log, enforce`) {
		t.Errorf("bad floor: %s", errOut)
	}
	out, errOut, code = b.run(t, "", nil, "machine", "create", "--pool", "default", "--min-profile", "hardened", "--min-egress", "enforce")
	if code != 0 || !strings.Contains(out, "security floor: profile=hardened egress=enforce") {
		t.Fatalf("machine create with a floor: %s %s", out, errOut)
	}
	id = regexp.MustCompile(`machine (m_[a-z2-7]+)`).FindStringSubmatch(out)
	script, _ = os.ReadFile(filepath.Join(b.home, "machines", id[1]+".sh"))
	if !strings.Contains(string(script), "\nAGENT_FLOOR=' --min-profile=hardened --min-egress=enforce'\n") {
		t.Errorf("the script lacks the floor")
	}
	out, _, _ = b.run(t, "", nil, "machine", "list", "-o", "json")
	if strings.Count(out, `"id"`) != 1 {
		t.Errorf("machines after a refused and an accepted create: %s", out)
	}

	// Labels: repeatable, shown by create, list and show; a bad one is
	// refused naming it, and creates nothing.
	for _, bad := range []struct{ arg, want string }{
		{"zone", `--label "zone": want KEY=VALUE`},
		{"zone=eu west", `label "zone": value "eu west"`},
	} {
		if _, errOut, code := b.run(t, "", nil, "machine", "create", "--pool", "default", "--label", bad.arg); code == 0 || !strings.Contains(errOut, bad.want) {
			t.Errorf("--label %s: %s, want %s", bad.arg, errOut, bad.want)
		}
	}
	out, errOut, code = b.run(t, "", nil, "machine", "create", "--pool", "default", "--name", "labelled", "--label", "zone=eu", "--label", "example.com/disk=ssd")
	if code != 0 || !strings.Contains(out, "labels: example.com/disk=ssd,zone=eu") {
		t.Fatalf("machine create with labels: %s %s", out, errOut)
	}
	id = regexp.MustCompile(`machine (m_[a-z2-7]+)`).FindStringSubmatch(out)
	if out, _, _ = b.run(t, "", nil, "machine", "list"); !regexp.MustCompile(`labelled .* example.com/disk=ssd,zone=eu`).MatchString(out) {
		t.Errorf("machine list lacks the labels: %s", out)
	}
	if out, _, _ = b.run(t, "", nil, "machine", "show", id[1]); !regexp.MustCompile(`Labels:\s+example.com/disk=ssd,zone=eu`).MatchString(out) {
		t.Errorf("machine show lacks the labels: %s", out)
	}
	if out, _, _ = b.run(t, "", nil, "machine", "list", "-o", "json"); strings.Count(out, `"id"`) != 2 {
		t.Errorf("machines after refused labels: %s", out)
	}
}
