package localstack

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

const mergeBase = `controlplane:
  grpcAddr: 127.0.0.1:1993
  logLevel: info
  auth:
    bootstrapSecret: "0123456789abcdef0123456789abcdef0123456789abcdef"
database:
  postgres:
    port: 5433
worker:
  defaultImage: 127.0.0.1:5000/levers9/demo:latest
  containerSecurity:
    seccomp: enforce
    egress:
      mode: enforce
      allow: [10.0.0.0/8, 192.168.0.0/16]
`

func TestMergeYAML(t *testing.T) {
	for _, tc := range []struct {
		name string
		user string
		// want maps a dotted key path of the merged config to its value
		// printed with %v.
		want map[string]string
		// wantErr are substrings of the error; the file name is checked
		// for every error.
		wantErr []string
	}{
		{
			name: "nested override keeps siblings",
			user: "worker:\n  containerSecurity:\n    egress:\n      mode: observe\n",
			want: map[string]string{
				"worker.containerSecurity.egress.mode":  "observe",
				"worker.containerSecurity.egress.allow": "[10.0.0.0/8 192.168.0.0/16]",
				"worker.containerSecurity.seccomp":      "enforce",
				"worker.defaultImage":                   "127.0.0.1:5000/levers9/demo:latest",
				"controlplane.grpcAddr":                 "127.0.0.1:1993",
			},
		},
		{
			name: "lists replace",
			user: "worker:\n  containerSecurity:\n    egress:\n      allow: [1.1.1.1/32]\n",
			want: map[string]string{"worker.containerSecurity.egress.allow": "[1.1.1.1/32]"},
		},
		{
			name: "new pools",
			user: "worker:\n  pools:\n    gvisor:\n      runtime: runsc\n      shared: true\n      security:\n        seccomp: log\n    extra: {}\n",
			want: map[string]string{
				"worker.pools.gvisor.runtime":          "runsc",
				"worker.pools.gvisor.shared":           "true",
				"worker.pools.gvisor.security.seccomp": "log",
				"worker.pools.extra":                   "map[]",
				"worker.defaultImage":                  "127.0.0.1:5000/levers9/demo:latest",
			},
		},
		{
			name: "scalar override",
			user: "controlplane:\n  logLevel: debug\n",
			want: map[string]string{"controlplane.logLevel": "debug", "controlplane.grpcAddr": "127.0.0.1:1993"},
		},
		{name: "empty file", user: "", want: map[string]string{"controlplane.logLevel": "info"}},
		{
			name:    "unknown key names file and key",
			user:    "worker:\n  pools:\n    gvisor:\n      runtim: runsc\n",
			wantErr: []string{"line 4", "worker.pools.gvisor.runtim: unknown key", "runtime"},
		},
		{
			name:    "unknown top-level key",
			user:    "workers:\n  defaultImage: x\n",
			wantErr: []string{"line 1: workers: unknown key (the top level takes controlplane, database, imageService, refuseDefaultEncryptionKey, volumes, worker)"},
		},
		{
			name:    "every unknown key at once",
			user:    "controlplane:\n  logLevl: debug\nworker:\n  containerSecurity:\n    egres: {}\n",
			wantErr: []string{"controlplane.logLevl: unknown key", "worker.containerSecurity.egres: unknown key"},
		},
		{
			name:    "managed key",
			user:    "database:\n  postgres:\n    port: 5432\n",
			wantErr: []string{"line 1: database: is set by make up"},
		},
		{
			name:    "bad YAML",
			user:    "worker:\n  pools: [\n",
			wantErr: []string{"not valid YAML", "line"},
		},
		{
			name:    "not a map",
			user:    "- worker\n",
			wantErr: []string{"line 1: want a map of config keys"},
		},
		{
			name:    "map where a value goes",
			user:    "worker:\n  defaultImage:\n    name: x\n",
			wantErr: []string{"line 3: worker.defaultImage: want a single value"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const file = "/src/levers9.local.yaml"
			out, err := mergeYAML([]byte(mergeBase), file, []byte(tc.user))
			if tc.wantErr != nil {
				if err == nil {
					t.Fatalf("no error; merged:\n%s", out)
				}
				for _, w := range append(tc.wantErr, file+": ") {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q lacks %q", err, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got map[string]any
			if err := yaml.Unmarshal(out, &got); err != nil {
				t.Fatalf("merged config does not parse: %v\n%s", err, out)
			}
			for path, want := range tc.want {
				if v := lookup(got, path); v != want {
					t.Errorf("%s = %s, want %s; merged:\n%s", path, v, want, out)
				}
			}
		})
	}
}

func lookup(m map[string]any, path string) string {
	var v any = m
	for _, k := range strings.Split(path, ".") {
		mm, ok := v.(map[string]any)
		if !ok {
			return "<missing>"
		}
		if v, ok = mm[k]; !ok {
			return "<missing>"
		}
	}
	s := strings.TrimSpace(strings.ReplaceAll(strings.ReplaceAll(yamlString(v), "\n", " "), "- ", ""))
	return s
}

func yamlString(v any) string {
	switch x := v.(type) {
	case []any:
		parts := make([]string, len(x))
		for i, e := range x {
			parts[i] = yamlString(e)
		}
		return "[" + strings.Join(parts, " ") + "]"
	case map[string]any:
		if len(x) == 0 {
			return "map[]"
		}
	}
	b, _ := yaml.Marshal(v)
	return strings.TrimSpace(string(b))
}

// TestMergeLocalConfigFiles: without a file the generated config is used
// byte for byte; with both files the second wins; the merged result goes
// through the controlplane's own validation, whose error names the file.
func TestMergeLocalConfigFiles(t *testing.T) {
	dir := t.TempDir()
	first, second := filepath.Join(dir, "levers9.local.yaml"), filepath.Join(dir, "controlplane.local.yaml")
	files := []string{first, second}
	out, used, err := mergeLocalConfig([]byte(mergeBase), files, nil)
	if err != nil || string(out) != mergeBase || len(used) != 0 {
		t.Fatalf("no file: %v, used %v, changed: %t", err, used, string(out) != mergeBase)
	}
	write := func(p, s string) {
		if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(first, "worker:\n  pools:\n    extra: {}\n    gvisor:\n      runtime: runsc\n")
	write(second, "worker:\n  pools:\n    gvisor:\n      runtime: runc\n")
	out, used, err = mergeLocalConfig([]byte(mergeBase), files, nil)
	if err != nil || len(used) != 2 {
		t.Fatalf("both files: %v, used %v", err, used)
	}
	var got map[string]any
	if err := yaml.Unmarshal(out, &got); err != nil {
		t.Fatal(err)
	}
	if v := lookup(got, "worker.pools.gvisor.runtime"); v != "runc" {
		t.Errorf("the second file should win: runtime %s", v)
	}
	if v := lookup(got, "worker.pools.extra"); v != "map[]" {
		t.Errorf("the first file's pool is lost: %s", v)
	}

	write(second, "worker:\n  pools:\n    gvisor:\n      runtime: kata\n")
	_, _, err = mergeLocalConfig([]byte(mergeBase), files, nil)
	if err == nil || !strings.Contains(err.Error(), second) || !strings.Contains(err.Error(), "worker.pools.gvisor.runtime") {
		t.Errorf("invalid value: %v, want the file and worker.pools.gvisor.runtime named", err)
	}
}
