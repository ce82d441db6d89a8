package enroll

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestJoinScript(t *testing.T) {
	t.Parallel()
	_, tok, _ := MintJoinToken()
	p := ScriptParams{MachineID: "m_abc", Pool: "default", ControlplaneGRPC: "10.0.0.1:1993", ControlplaneREST: "https://10.0.0.1:1994",
		CAPEM: "-----BEGIN CERTIFICATE-----\nAAA\n-----END CERTIFICATE-----\n", AgentSHA256: map[string]string{"linux-amd64": strings.Repeat("a", 64)},
		Token: tok, ExpiresAt: time.Now()}
	s, err := JoinScript(p)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"MACHINE_ID='m_abc'", "JOIN_TOKEN='" + tok + "'", "linux-amd64) WANT_SHA256='" + strings.Repeat("a", 64), "--token-file", "L9CAPEM"} {
		if !strings.Contains(s, want) {
			t.Errorf("script lacks %q", want)
		}
	}
	sh := exec.Command("sh", "-n")
	sh.Stdin = strings.NewReader(s)
	if out, err := sh.CombinedOutput(); err != nil {
		t.Fatalf("sh -n: %v\n%s", err, out)
	}
	if strings.Count(s, tok) != 1 {
		t.Error("the token must appear once, in the variable, never on a command line")
	}
	bad := p
	bad.Pool = "x'; rm -rf /"
	if _, err := JoinScript(bad); err == nil {
		t.Error("shell metacharacters accepted")
	}
	bad = p
	bad.Token = "nope"
	if _, err := JoinScript(bad); err == nil {
		t.Error("bad token accepted")
	}
	bad = p
	bad.AgentSHA256 = map[string]string{"linux-amd64": "xyz"}
	if _, err := JoinScript(bad); err == nil {
		t.Error("bad checksum accepted")
	}
}

func TestScriptFloor(t *testing.T) {
	t.Parallel()
	_, tok, _ := MintJoinToken()
	s, err := JoinScript(ScriptParams{MachineID: "m_abc", Pool: "default", ControlplaneGRPC: "10.0.0.1:1993",
		ControlplaneREST: "https://10.0.0.1:1994", Token: tok, ExpiresAt: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	floored, err := SetScriptFloor(s, Floor{Profile: "hardened", Seccomp: "enforce", Egress: "enforce"})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(floored, "\nAGENT_FLOOR=' --min-profile=hardened --min-seccomp=enforce --min-egress=enforce'\n") {
		t.Errorf("floor line missing:\n%s", floored)
	}
	sh := exec.Command("sh", "-n")
	sh.Stdin = strings.NewReader(floored)
	if out, err := sh.CombinedOutput(); err != nil {
		t.Fatalf("sh -n: %v\n%s", err, out)
	}
	if _, err := SetScriptFloor(s, Floor{Profile: "paranoid"}); err == nil || !strings.Contains(err.Error(), `--min-profile: "paranoid"`) {
		t.Errorf("bad floor: %v", err)
	}
	if _, err := SetScriptFloor(strings.Replace(s, "AGENT_FLOOR=''", "", 1), Floor{Profile: "hardened"}); err == nil || !strings.Contains(err.Error(), "AGENT_FLOOR") {
		t.Errorf("script without the floor line: %v", err)
	}

	// An already joined machine: the script starts the agent with the
	// floor's flags, then the operator's.
	if os.Geteuid() != 0 {
		return
	}
	dir := t.TempDir()
	state, bin := filepath.Join(dir, "state"), filepath.Join(dir, "bin")
	os.MkdirAll(state, 0o700)
	os.MkdirAll(bin, 0o700)
	os.WriteFile(filepath.Join(state, "machine-id"), []byte("m_abc"), 0o600)
	os.WriteFile(filepath.Join(state, "agent.crt"), []byte("x"), 0o600)
	os.WriteFile(filepath.Join(bin, "levers9-agent"), []byte("#!/bin/sh\necho \"$@\"\n"), 0o700)
	script := filepath.Join(dir, "join.sh")
	os.WriteFile(script, []byte(floored), 0o600)
	out, err := exec.Command("sh", script, "--foreground", "--state-dir", state, "--etc-dir", filepath.Join(dir, "etc"), "--bin-dir", bin,
		"--", "--insecure-registries", "r:5000").CombinedOutput()
	want := "run --state-dir " + state + " --min-profile=hardened --min-seccomp=enforce --min-egress=enforce --insecure-registries r:5000\n"
	if err != nil || !strings.HasSuffix(string(out), want) {
		t.Errorf("script run: %v\n%s\nwant the agent started with: %s", err, out, want)
	}
}
