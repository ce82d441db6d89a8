package enroll

import (
	"os/exec"
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
