package sandbox

import (
	"encoding/json"
	"log/slog"
	"strings"
)

// SecretEnv is a task's secret environment, KEY=VALUE entries. Printing,
// logging or marshalling it shows the keys only, so a value cannot leak
// through a %v, a slog attribute or a JSON record by mistake.
type SecretEnv []string

// Keys are the variable names, in order.
func (e SecretEnv) Keys() []string {
	out := make([]string, 0, len(e))
	for _, kv := range e {
		k, _, _ := strings.Cut(kv, "=")
		out = append(out, k)
	}
	return out
}

// String shows the keys only.
func (e SecretEnv) String() string { return "[" + strings.Join(e.Keys(), " ") + " (values hidden)]" }

// GoString shows the keys only.
func (e SecretEnv) GoString() string { return e.String() }

// LogValue shows the keys only.
func (e SecretEnv) LogValue() slog.Value { return slog.StringValue(e.String()) }

// MarshalJSON shows the keys only.
func (e SecretEnv) MarshalJSON() ([]byte, error) { return json.Marshal(e.Keys()) }

// withSecretEnv returns env with e's keys replaced or appended.
func withSecretEnv(env []string, e SecretEnv) []string {
	set := map[string]bool{}
	for _, k := range e.Keys() {
		set[k] = true
	}
	out := make([]string, 0, len(env)+len(e))
	for _, kv := range env {
		if k, _, _ := strings.Cut(kv, "="); !set[k] {
			out = append(out, kv)
		}
	}
	return append(out, e...)
}
