package repocheck

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

const module = "github.com/levers9/levers9"

type pkg struct {
	ImportPath string
	Dir        string
	Name       string
	GoFiles    []string
	Imports    []string
	Deps       []string
}

func listPackages(t *testing.T) []pkg {
	t.Helper()
	cmd := exec.Command("go", "list", "-json", module+"/...")
	cmd.Dir = "../.."
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var pkgs []pkg
	dec := json.NewDecoder(out)
	for {
		var p pkg
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("go list: %v", err)
	}
	if len(pkgs) < 5 {
		t.Fatalf("go list found only %d packages", len(pkgs))
	}
	return pkgs
}

// TestEveryPackageHasOneDocComment: a package says once what it owns.
func TestEveryPackageHasOneDocComment(t *testing.T) {
	for _, p := range listPackages(t) {
		docs := 0
		for _, f := range p.GoFiles {
			file, err := parser.ParseFile(token.NewFileSet(), filepath.Join(p.Dir, f), nil, parser.ParseComments)
			if err != nil {
				t.Fatal(err)
			}
			if isGenerated(file.Comments) {
				continue
			}
			if file.Doc != nil && strings.TrimSpace(file.Doc.Text()) != "" {
				docs++
			}
		}
		if docs != 1 {
			t.Errorf("%s: %d package doc comments, want exactly 1", p.ImportPath, docs)
		}
	}
}

// part is the top-level folder of an import path inside the module.
func part(path string) string {
	rest, ok := strings.CutPrefix(path, module+"/")
	if !ok {
		return ""
	}
	first, _, _ := strings.Cut(rest, "/")
	return first
}

// sharedLeaves are packages inside a part that other parts may import
// although the part itself is off limits to them: each is a leaf that
// imports no levers9 package but internal/ (TestSharedLeavesAreLeaves), so
// importing it drags in nothing of its part. sandbox/image/recipe is the
// image recipe the CLI, the SDK, the controlplane and the agent share.
var sharedLeaves = map[string]bool{
	module + "/sandbox/image/recipe": true,
}

// TestSharedLeavesAreLeaves keeps the exceptions of sharedLeaves honest.
func TestSharedLeavesAreLeaves(t *testing.T) {
	found := 0
	for _, p := range listPackages(t) {
		if !sharedLeaves[p.ImportPath] {
			continue
		}
		found++
		for _, d := range p.Deps {
			if part(d) != "" && part(d) != "internal" {
				t.Errorf("%s is a shared leaf but depends on %s", p.ImportPath, d)
			}
		}
	}
	if found != len(sharedLeaves) {
		t.Errorf("found %d of %d shared leaves", found, len(sharedLeaves))
	}
}

// TestDependenciesPointOneWay enforces the layering of DESIGN.md.
func TestDependenciesPointOneWay(t *testing.T) {
	// allowed lists, for each part, the other parts it may import; nil means
	// any. internal/ and api/ are always allowed.
	allowed := map[string][]string{
		"tunnel":  {},
		"sandbox": {},
		"egress":  {},
		"sdk":     {},
		"api":     {},
		// The dashboard reaches the controlplane through api/ only.
		"dashboard": {},
		"agent":     {"tunnel", "sandbox", "egress", "enroll", "volumes"},
		// Volumes and their drivers know nothing of the other parts.
		"volumes": {},
		"enroll":  {"tunnel"},
	}
	forbiddenExternal := map[string][]string{
		"agent":     {"github.com/jackc/pgx"},
		"sandbox":   {"github.com/jackc/pgx", "github.com/redis/go-redis"},
		"egress":    {"github.com/jackc/pgx", "github.com/redis/go-redis"},
		"tunnel":    {"github.com/jackc/pgx"},
		"sdk":       {"github.com/jackc/pgx", "github.com/redis/go-redis"},
		"volumes":   {"github.com/jackc/pgx", "github.com/redis/go-redis"},
		"dashboard": {"github.com/jackc/pgx", "github.com/redis/go-redis"},
	}
	for _, p := range listPackages(t) {
		from := part(p.ImportPath)
		for _, imp := range p.Imports {
			if to := part(imp); to != "" && to != from {
				if to == "cmd" {
					t.Errorf("%s imports %s: nothing imports a main", p.ImportPath, imp)
				}
				// Benchmarks are test programs and may use test support.
				if isTestSupport(imp) && !isTestSupport(p.ImportPath) && from != "bench" {
					t.Errorf("%s imports test-only %s outside tests", p.ImportPath, imp)
				}
				if to == "internal" || (to == "api" && from != "api") || sharedLeaves[imp] {
					continue
				}
				if list, ok := allowed[from]; ok && !contains(list, to) {
					t.Errorf("%s (part %s) imports %s (part %s): not allowed", p.ImportPath, from, imp, to)
				}
			}
			for _, bad := range forbiddenExternal[from] {
				if strings.HasPrefix(imp, bad) {
					t.Errorf("%s imports %s", p.ImportPath, imp)
				}
			}
		}
	}
}

// isTestSupport reports packages that exist only for tests (…test
// packages and internal/testenv).
func isTestSupport(path string) bool {
	return strings.HasSuffix(path, "test") || strings.HasSuffix(path, "/internal/testenv")
}

func isGenerated(comments []*ast.CommentGroup) bool {
	for _, g := range comments {
		for _, c := range g.List {
			if strings.HasPrefix(c.Text, "// Code generated ") && strings.HasSuffix(c.Text, " DO NOT EDIT.") {
				return true
			}
		}
	}
	return false
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// TestMachineAgentWithoutClientGo: client-go is the cluster agent's alone
// (agent/clusteragent); the machine agent's packages do not link it, even
// indirectly (enroll keeps the shared Kubernetes names, not the client).
func TestMachineAgentWithoutClientGo(t *testing.T) {
	checked := 0
	for _, p := range listPackages(t) {
		if part(p.ImportPath) != "agent" || strings.HasPrefix(p.ImportPath, module+"/agent/clusteragent") {
			continue
		}
		checked++
		for _, d := range p.Deps {
			if strings.HasPrefix(d, "k8s.io/client-go") {
				t.Errorf("%s depends on %s: only agent/clusteragent may use client-go", p.ImportPath, d)
				break
			}
		}
	}
	if checked < 3 {
		t.Fatalf("checked only %d agent packages", checked)
	}
}
