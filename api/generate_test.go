package api

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/levers9/levers9/internal/testenv"
)

// TestGeneratedCodeIsFresh regenerates the protobuf code into a temporary
// directory and fails when the committed code differs: edit a .proto, run
// `make proto`, commit both.
func TestGeneratedCodeIsFresh(t *testing.T) {
	testenv.RequireBinary(t, "protoc")
	out := t.TempDir()
	cmd := exec.Command("bash", "generate.sh", out)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("generate.sh: %v\n%s", err, b)
	}
	for _, dir := range []string{filepath.Join("levers9", "v1"), filepath.Join("levers9", "agent", "v1")} {
		genDir := filepath.Join(out, "api", dir)
		gen, err := filepath.Glob(filepath.Join(genDir, "*.go"))
		if err != nil || len(gen) == 0 {
			t.Fatalf("no generated files in %s (err %v)", genDir, err)
		}
		committed, _ := filepath.Glob(filepath.Join(dir, "*.pb*.go"))
		if len(committed) != len(gen) {
			t.Errorf("%s: committed %d generated files, generator makes %d: run make proto", dir, len(committed), len(gen))
		}
		for _, g := range gen {
			name := filepath.Join(dir, filepath.Base(g))
			want, _ := os.ReadFile(g)
			got, err := os.ReadFile(name)
			if err != nil {
				t.Errorf("%s: not committed: run make proto", name)
				continue
			}
			if !bytes.Equal(got, want) {
				t.Errorf("%s is stale: run make proto and commit the result", name)
			}
		}
	}
}
