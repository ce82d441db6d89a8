package config

import (
	"strings"
	"testing"
)

// TestApparmorProfileKey: worker.containerSecurity.apparmorProfile
// defaults to levers9-default, takes its LEVERS9_ override, a pool may
// override it, and a bad name is refused naming the key.
func TestApparmorProfileKey(t *testing.T) {
	t.Parallel()
	c, err := Load(strings.NewReader(""), nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Worker.EffectiveSecurity("default").ApparmorProfile; got != "levers9-default" {
		t.Errorf("default %q", got)
	}
	yml := "worker:\n  pools:\n    gpu:\n      security: {apparmorProfile: gpu-profile}\n"
	c, err = Load(strings.NewReader(yml), envMap(map[string]string{"LEVERS9_WORKER_CONTAINERSECURITY_APPARMORPROFILE": "site-profile"}))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Worker.EffectiveSecurity("default").ApparmorProfile; got != "site-profile" {
		t.Errorf("env override: %q", got)
	}
	if got := c.Worker.EffectiveSecurity("gpu").ApparmorProfile; got != "gpu-profile" {
		t.Errorf("pool override: %q", got)
	}
	yml = "worker:\n  containerSecurity: {apparmorProfile: \"/etc/apparmor.d/x\"}\n  pools:\n    gpu:\n      security: {apparmorProfile: \"a b\"}\n"
	_, err = Load(strings.NewReader(yml), nil)
	for _, key := range []string{"worker.containerSecurity.apparmorProfile:", "worker.pools.gpu.security.apparmorProfile:"} {
		if err == nil || !strings.Contains(err.Error(), key) {
			t.Errorf("want an error naming %s, got %v", key, err)
		}
	}
}
