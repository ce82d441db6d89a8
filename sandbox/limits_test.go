package sandbox

import (
	"os"
	"path/filepath"
	"testing"
)

func TestReadLimitKills(t *testing.T) {
	write := func(root, p, body string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, p), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	v2 := t.TempDir()
	write(v2, "l9/c1/memory.events", "low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\noom_group_kill 0\n")
	write(v2, "l9/c1/pids.events", "max 3\n")
	v1 := t.TempDir()
	write(v1, "memory/l9/c1/memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
	tests := []struct {
		root string
		want LimitKills
		err  bool
	}{
		{v2, LimitKills{OOMKills: 1, PidsMax: 3}, false},
		{v1, LimitKills{OOMKills: 2}, false},
		{t.TempDir(), LimitKills{}, true},
	}
	for i, tt := range tests {
		got, err := readLimitKills(tt.root, "/l9/c1")
		if got != tt.want || (err != nil) != tt.err {
			t.Errorf("%d: %+v, %v; want %+v", i, got, err, tt.want)
		}
	}
}
