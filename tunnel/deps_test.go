package tunnel_test

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// The tunnel imports no other levers9 part: only internal/errdefs and
// internal/clock.
func TestImportsNoOtherPart(t *testing.T) {
	allowed := map[string]bool{"github.com/levers9/levers9/internal/errdefs": true, "github.com/levers9/levers9/internal/clock": true}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		af, err := parser.ParseFile(token.NewFileSet(), f, src, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range af.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			if strings.HasPrefix(p, "github.com/levers9/levers9/") && !allowed[p] {
				t.Errorf("%s imports %s: the tunnel must not depend on other parts", f, p)
			}
		}
	}
}
