package cli

import (
	"encoding/json"
	"strings"
	"testing"
)

// token create --role, the role in token list (table and JSON), and a
// member token refused what only an admin may do, with the role named.
func TestTokenRoles(t *testing.T) {
	t.Parallel()
	b := setup(t)
	boot := map[string]string{
		"LEVERS9_BOOTSTRAP_SECRET": "test-bootstrap-secret-0123456789abcdef",
		"LEVERS9_CONTROLPLANE_TLS": "true",
		"LEVERS9_CONTROLPLANE_CA":  b.cert,
	}
	if _, errOut, code := b.run(t, b.addr+"\n\n", boot, "whoami"); code != 0 {
		t.Fatalf("bootstrap: %s", errOut)
	}
	_, errOut, code := b.run(t, "", nil, "token", "create", "--role", "root")
	if code == 0 || !strings.Contains(errOut, `--role "root": must be one of admin, member, machine-join`) {
		t.Errorf("a bad --role: %d %s", code, errOut)
	}
	member, errOut, code := b.run(t, "", nil, "token", "create", "--name", "ci")
	if code != 0 || !strings.Contains(errOut, "role member") {
		t.Fatalf("token create without --role: %d %s", code, errOut)
	}
	if _, errOut, code := b.run(t, "", nil, "token", "create", "--name", "joiner", "--role", "machine-join"); code != 0 {
		t.Fatalf("token create --role machine-join: %s", errOut)
	}

	out, _, code := b.run(t, "", nil, "token", "list")
	rows := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if f := strings.Fields(line); len(f) >= 3 {
			rows[f[1]] = f[2]
		}
	}
	if code != 0 || rows["NAME"] != "ROLE" || rows["admin"] != "admin" || rows["ci"] != "member" || rows["joiner"] != "machine-join" {
		t.Errorf("token list roles %v from:\n%s", rows, out)
	}
	out, _, _ = b.run(t, "", nil, "token", "list", "-o", "json")
	var list struct {
		Tokens []struct{ Name, Role string } `json:"tokens"`
	}
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, tk := range list.Tokens {
		got[tk.Name] = tk.Role
	}
	if got["admin"] != "ROLE_ADMIN" || got["ci"] != "ROLE_MEMBER" || got["joiner"] != "ROLE_MACHINE_JOIN" {
		t.Errorf("token list -o json roles %v", got)
	}

	asMember := map[string]string{"LEVERS9_TOKEN": strings.TrimSpace(member)}
	_, errOut, code = b.run(t, "", asMember, "token", "list")
	if code == 0 || !strings.Contains(errOut, "needs a token with role admin, and this token's role is member") {
		t.Errorf("token list with a member token: %d %s", code, errOut)
	}
	if out, errOut, code := b.run(t, "", asMember, "whoami"); code != 0 || !strings.Contains(out, "workspace default") {
		t.Errorf("whoami with a member token: %d %s %s", code, out, errOut)
	}
}
