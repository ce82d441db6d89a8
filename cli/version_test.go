package cli

import (
	"net"
	"strings"
	"testing"

	"github.com/levers9/levers9/internal/version"
)

// TestVersion: the CLI prints its own version always, the controlplane's
// when a context reaches one, and exits 0 when it cannot (the client part
// worked), saying why on the controlplane line.
func TestVersion(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// A port nothing listens on: bound, then closed.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	tlsEnv := map[string]string{"LEVERS9_CONTROLPLANE_TLS": "true", "LEVERS9_CONTROLPLANE_CA": b.cert}
	with := func(extra map[string]string) map[string]string {
		m := map[string]string{}
		for k, v := range tlsEnv {
			m[k] = v
		}
		for k, v := range extra {
			m[k] = v
		}
		return m
	}
	tests := []struct {
		name string
		env  map[string]string
		want []string
	}{
		{"no context", nil, []string{"levers9: " + version.String() + "\n", "controlplane: no context configured"}},
		{"reachable", with(map[string]string{"LEVERS9_CONTROLPLANE": b.addr}),
			[]string{"levers9: " + version.String() + "\n", "controlplane: " + version.String() + " at " + b.addr + "\n"}},
		{"unreachable", with(map[string]string{"LEVERS9_CONTROLPLANE": dead}),
			[]string{"levers9: " + version.String() + "\n", "controlplane: unreachable (" + dead + ": nothing listens on"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			out, errOut, code := b.run(t, "", tc.env, "version")
			if code != 0 {
				t.Fatalf("exit %d: %s", code, errOut)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
			if errOut != "" {
				t.Errorf("stderr: %s", errOut)
			}
		})
	}
}
