package helmchart

import (
	"testing"

	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/v2/lint"
	"helm.sh/helm/v4/pkg/chart/v2/lint/support"
)

// TestLint runs `helm lint`'s rules (Chart.yaml, values, schema, templates,
// deprecated APIs) with the least working values; a warning fails too.
func TestLint(t *testing.T) {
	t.Parallel()
	kv, err := common.ParseKubeVersion(renderKubeVersion)
	if err != nil {
		t.Fatal(err)
	}
	res := lint.RunAll(chartDir(t), baseValues(), "levers9", lint.WithKubeVersion(kv))
	for _, m := range res.Messages {
		if m.Severity > support.InfoSev {
			t.Errorf("lint: %v", m)
		} else {
			t.Logf("lint: %v", m)
		}
	}
}
