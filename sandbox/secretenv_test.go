package sandbox

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
)

// TestSecretEnvHidesValues: printing, logging or marshalling a task's
// secrets shows their keys, never their values.
func TestSecretEnvHidesValues(t *testing.T) {
	const value = "hunter2-value"
	task := TaskSpec{ID: "t1", Env: []string{"A=1"}, SecretEnv: SecretEnv{"DB_PASSWORD=" + value, "TOKEN=" + value}}
	var logged bytes.Buffer
	slog.New(slog.NewJSONHandler(&logged, nil)).Info("task", "secrets", task.SecretEnv, "task", task)
	js, err := json.Marshal(task)
	if err != nil {
		t.Fatal(err)
	}
	for name, out := range map[string]string{
		"%v": fmt.Sprintf("%v", task), "%+v": fmt.Sprintf("%+v", task), "%#v": fmt.Sprintf("%#v", task),
		"slog": logged.String(), "json": string(js), "String": task.SecretEnv.String(),
	} {
		if strings.Contains(out, value) {
			t.Errorf("%s shows the value: %s", name, out)
		}
	}
	if got := task.SecretEnv.Keys(); !slices.Equal(got, []string{"DB_PASSWORD", "TOKEN"}) {
		t.Fatalf("keys %v", got)
	}
	if err := (TaskSpec{ID: "t1", Rootfs: "/r", Args: []string{"x"}, SecretEnv: SecretEnv{value}}).Validate(); err == nil || strings.Contains(err.Error(), value) {
		t.Fatalf("a bad entry must be refused without its text: %v", err)
	}
}

func TestWithSecretEnvReplacesKeys(t *testing.T) {
	got := withSecretEnv([]string{"PATH=/bin", "DB_PASSWORD=image-default", "X=1"}, SecretEnv{"DB_PASSWORD=s"})
	if want := []string{"PATH=/bin", "X=1", "DB_PASSWORD=s"}; !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
}
