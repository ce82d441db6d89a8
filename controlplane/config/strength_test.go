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

func TestMetricsKeys(t *testing.T) {
	t.Parallel()
	c, err := Load(strings.NewReader(""), nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.Controlplane.Metrics.Addr != "127.0.0.1:1996" || c.Controlplane.Metrics.Token != "" {
		t.Errorf("metrics defaults = %+v, want loopback 1996 and no token", c.Controlplane.Metrics)
	}
	if _, err := Load(strings.NewReader("controlplane:\n  metrics: {addr: \"off\"}\n"), nil); err != nil {
		t.Errorf("addr off: %v", err)
	}
	_, err = Load(strings.NewReader("controlplane:\n  metrics: {addr: nonsense, token: shorttoken}\n"), nil)
	for _, want := range []string{"controlplane.metrics.addr:", "controlplane.metrics.token:"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error does not name %s: %v", want, err)
		}
	}
	if err != nil && strings.Contains(err.Error(), "shorttoken") {
		t.Errorf("token leaked: %v", err)
	}
	c, err = Load(strings.NewReader(""), envMap(map[string]string{
		"LEVERS9_CONTROLPLANE_METRICS_ADDR":  "0.0.0.0:9100",
		"LEVERS9_CONTROLPLANE_METRICS_TOKEN": "metrics-token-0123456789abcdefghij",
	}))
	if err != nil || c.Controlplane.Metrics.Addr != "0.0.0.0:9100" || c.Controlplane.Metrics.Token == "" {
		t.Errorf("env overrides: %+v %v", c.Controlplane.Metrics, err)
	}
}
