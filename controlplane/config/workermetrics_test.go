package config

import (
	"strings"
	"testing"
	"time"
)

func TestWorkerMetricsKeys(t *testing.T) {
	t.Parallel()
	c, err := Load(strings.NewReader(""), nil)
	if err != nil {
		t.Fatal(err)
	}
	m := c.Controlplane.Metrics
	if m.WorkerMetricsInterval() != 0 || m.WorkerMetricsExpiry() != time.Minute || m.WorkerMaxSeries != 2000 {
		t.Errorf("defaults: interval %s expiry %s max %d", m.WorkerMetricsInterval(), m.WorkerMetricsExpiry(), m.WorkerMaxSeries)
	}
	for _, tc := range []struct{ yaml, key string }{
		{"{workerInterval: 100ms}", "controlplane.metrics.workerInterval:"},
		{"{workerInterval: soon}", "controlplane.metrics.workerInterval:"},
		{"{workerInterval: 1m, workerExpiry: 90s}", "controlplane.metrics.workerExpiry:"},
		{"{workerExpiry: never}", "controlplane.metrics.workerExpiry:"},
		{"{workerMaxSeries: -1}", "controlplane.metrics.workerMaxSeries:"},
	} {
		_, err := Load(strings.NewReader("controlplane:\n  metrics: "+tc.yaml+"\n"), nil)
		if err == nil || !strings.Contains(err.Error(), tc.key) {
			t.Errorf("%s: error does not name %s: %v", tc.yaml, tc.key, err)
		}
	}
	c, err = Load(strings.NewReader(""), envMap(map[string]string{
		"LEVERS9_CONTROLPLANE_METRICS_WORKERINTERVAL":  "5s",
		"LEVERS9_CONTROLPLANE_METRICS_WORKEREXPIRY":    "30s",
		"LEVERS9_CONTROLPLANE_METRICS_WORKERMAXSERIES": "50",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if m := c.Controlplane.Metrics; m.WorkerMetricsInterval() != 5*time.Second || m.WorkerMetricsExpiry() != 30*time.Second || m.WorkerMaxSeries != 50 {
		t.Errorf("env overrides: %+v", m)
	}
}
