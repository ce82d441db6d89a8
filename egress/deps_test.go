package egress

import (
	"go/parser"
	"go/token"
	"os"
	"strconv"
	"strings"
	"testing"
)

// TestImports keeps egress independent of every other levers9 part: it may
// import only the standard-library-only leaves internal/errdefs,
// internal/clock and internal/procstat from this module.
func TestImports(t *testing.T) {
	t.Parallel()
	ents, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), e.Name(), nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			allowed := p == "github.com/levers9/levers9/internal/errdefs" || p == "github.com/levers9/levers9/internal/clock" ||
				p == "github.com/levers9/levers9/internal/procstat"
			if strings.HasPrefix(p, "github.com/levers9/levers9/") && !allowed {
				t.Errorf("%s imports %s", e.Name(), p)
			}
		}
	}
}
