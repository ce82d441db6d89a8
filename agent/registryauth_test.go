package agent

import (
	"fmt"
	"strings"
	"testing"

	agentv1 "github.com/levers9/levers9/api/levers9/agent/v1"
)

// The push's registry login reaches the task's pull keychain, and the
// task printed (as a log or an error might) does not show the password.
func TestRegistryAuthTranslated(t *testing.T) {
	const pw = "tr-pw-5d1c9e"
	task, err := taskFromAttempt(&agentv1.TaskAttempt{TaskId: "t_1", Attempt: 1, Image: "reg.example:5000/a:v1",
		RegistryAuth: &agentv1.RegistryAuth{Host: "reg.example:5000", Username: "ci", Password: pw}}, "default")
	if err != nil {
		t.Fatal(err)
	}
	c, ok := task.RegistryAuth["reg.example:5000"]
	if !ok || c.Username != "ci" || c.Password != pw {
		t.Fatalf("keychain: %v", task.RegistryAuth)
	}
	for _, s := range []string{fmt.Sprintf("%v", task), fmt.Sprintf("%+v", task), fmt.Sprintf("%#v", task.RegistryAuth)} {
		if strings.Contains(s, pw) {
			t.Errorf("printed task shows the password: %s", s)
		}
	}
	if _, err := taskFromAttempt(&agentv1.TaskAttempt{TaskId: "t_1", Attempt: 1, Image: "a:v1",
		RegistryAuth: &agentv1.RegistryAuth{Password: pw}}, "default"); err == nil || !strings.Contains(err.Error(), "task.registryAuth") || strings.Contains(err.Error(), pw) {
		t.Errorf("a login without host or username: %v", err)
	}
}
