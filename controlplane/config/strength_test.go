package config

import (
	"strings"
	"testing"
)

func TestBootstrapSecretMinimumLength(t *testing.T) {
	t.Parallel()
	const short = "only-31-characters-long-secret!"
	if len(short) != 31 {
		t.Fatalf("len = %d", len(short))
	}
	_, err := Load(strings.NewReader(""), envMap(map[string]string{"LEVERS9_BOOTSTRAP_SECRET": short}))
	if err == nil || !strings.Contains(err.Error(), "controlplane.auth.bootstrapSecret:") {
		t.Fatalf("a 31-character bootstrap secret must be refused naming the key, got %v", err)
	}
	if strings.Contains(err.Error(), short) {
		t.Errorf("the secret leaked into the error: %v", err)
	}
	c, err := Load(strings.NewReader(""), envMap(map[string]string{"LEVERS9_BOOTSTRAP_SECRET": short + "x"}))
	if err != nil {
		t.Fatalf("32 characters must be accepted: %v", err)
	}
	c.Controlplane.Auth.BootstrapSecret = ""
	if err := c.Validate(); err != nil {
		t.Errorf("an empty secret turns bootstrap off and is allowed: %v", err)
	}
	c.Controlplane.Auth.BootstrapSecret = "short"
	if err := c.CheckStartable(); err == nil || !strings.Contains(err.Error(), "controlplane.auth.bootstrapSecret") {
		t.Errorf("CheckStartable must refuse a short secret set after Load, got %v", err)
	}
}
