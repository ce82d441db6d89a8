package helmchart

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	release "helm.sh/helm/v4/pkg/release/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/levers9/levers9/controlplane/config"
	"github.com/levers9/levers9/internal/kubeworkers"
)

// chartDir is the chart under test, found from this file so the tests run
// from any working directory.
func chartDir(t testing.TB) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("no caller information")
	}
	return filepath.Join(filepath.Dir(file), "levers9")
}

// Sentinels stand for secret values: none may appear outside a Secret.
const (
	sentinelAccessKey = "SENTINEL-ACCESS-KEY-ID-7f3a"
	sentinelSecretKey = "SENTINEL-SECRET-ACCESS-KEY-9c1e"
)

// baseValues are the least a working install needs.
func baseValues() map[string]any {
	return map[string]any{
		"images": map[string]any{"controlplane": map[string]any{"repository": "registry.example.com/levers9/levers9-controlplane"}},
		"config": map[string]any{
			"worker":       map[string]any{"imageRegistry": "registry.example.com"},
			"imageService": map[string]any{"runner": map[string]any{"baseImageRegistry": "registry.example.com/levers9"}},
		},
		"postgres": map[string]any{"host": "pg.example.internal"},
		"redis":    map[string]any{"host": "redis.example.internal"},
	}
}

// with returns vals with the value at a dotted path set (maps created on the
// way); a nil value deletes the key.
func with(vals map[string]any, path string, v any) map[string]any {
	out := deepCopy(vals)
	parts := strings.Split(path, ".")
	m := out
	for _, p := range parts[:len(parts)-1] {
		next, ok := m[p].(map[string]any)
		if !ok {
			next = map[string]any{}
			m[p] = next
		}
		m = next
	}
	if v == nil {
		delete(m, parts[len(parts)-1])
	} else {
		m[parts[len(parts)-1]] = v
	}
	return out
}

func deepCopy(m map[string]any) map[string]any {
	out := maps.Clone(m)
	for k, v := range out {
		if sub, ok := v.(map[string]any); ok {
			out[k] = deepCopy(sub)
		}
	}
	return out
}

// renderKubeVersion is the Kubernetes release render tests assume.
const renderKubeVersion = "v1.36.3"

// object is one rendered manifest.
type object map[string]any

func (o object) kind() string { s, _ := o["kind"].(string); return s }
func (o object) name() string { s, _ := o.get("metadata", "name").(string); return s }
func (o object) get(path ...string) any {
	var cur any = map[string]any(o)
	for _, p := range path {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil
		}
		cur = m[p]
	}
	return cur
}

type rendered struct {
	manifest string
	objects  []object
}

// find returns the one object of this kind and name, failing the test if
// there is none.
func (r rendered) find(t testing.TB, kind, name string) object {
	t.Helper()
	for _, o := range r.objects {
		if o.kind() == kind && o.name() == name {
			return o
		}
	}
	t.Fatalf("no %s %s rendered", kind, name)
	return nil
}

func (r rendered) has(kind, name string) bool {
	for _, o := range r.objects {
		if o.kind() == kind && o.name() == name {
			return true
		}
	}
	return false
}

// render runs the chart as `helm template` does (client-side dry run, schema
// validation, the chart's kubeVersion checked against helm's default), in
// namespace levers9.
func render(t testing.TB, vals map[string]any) (rendered, error) {
	t.Helper()
	ch, err := loader.Load(chartDir(t))
	if err != nil {
		t.Fatalf("load the chart: %v", err)
	}
	cfg := action.NewConfiguration(action.ConfigurationSetLogger(slog.NewTextHandler(io.Discard, nil)))
	in := action.NewInstall(cfg)
	in.DryRunStrategy = action.DryRunClient
	in.ReleaseName = "levers9"
	in.Namespace = "levers9"
	in.Replace = true
	// helm's own default (v1.20) is older than the chart's kubeVersion;
	// render for the release the install tests run.
	kv, err := common.ParseKubeVersion(renderKubeVersion)
	if err != nil {
		t.Fatal(err)
	}
	in.KubeVersion = kv
	rel, err := in.Run(ch, deepCopy(vals))
	if err != nil {
		return rendered{}, err
	}
	r, ok := rel.(*release.Release)
	if !ok {
		t.Fatalf("release is a %T", rel)
	}
	objs, err := splitManifest(r.Manifest)
	if err != nil {
		t.Fatalf("parse the rendered manifest: %v", err)
	}
	return rendered{manifest: r.Manifest, objects: objs}, nil
}

func mustRender(t testing.TB, vals map[string]any) rendered {
	t.Helper()
	r, err := render(t, vals)
	if err != nil {
		t.Fatalf("render: %v", err)
	}
	return r
}

func splitManifest(manifest string) ([]object, error) {
	var out []object
	for i, doc := range strings.Split(manifest, "\n---") {
		if strings.TrimSpace(doc) == "" {
			continue
		}
		var o object
		if err := yaml.Unmarshal([]byte(doc), &o); err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		if len(o) == 0 {
			continue
		}
		out = append(out, o)
	}
	if len(out) == 0 {
		return nil, errors.New("no objects")
	}
	return out, nil
}

// containers lists a pod spec's init and main containers.
func containers(podSpec map[string]any) []map[string]any {
	var out []map[string]any
	for _, key := range []string{"initContainers", "containers"} {
		list, _ := podSpec[key].([]any)
		for _, c := range list {
			if m, ok := c.(map[string]any); ok {
				out = append(out, m)
			}
		}
	}
	return out
}

// podSpecs finds every pod spec in the rendered objects: workloads' and
// the worker Jobs the controlplane builds for its pools with provider
// kubernetes.
func podSpecs(t testing.TB, r rendered) map[string]map[string]any {
	t.Helper()
	out := map[string]map[string]any{}
	for _, o := range r.objects {
		switch o.kind() {
		case "Deployment", "StatefulSet", "DaemonSet", "Job":
			if s, ok := o.get("spec", "template", "spec").(map[string]any); ok {
				out[o.kind()+"/"+o.name()] = s
			}
		}
	}
	c := loadConfig(t, r)
	for name, p := range c.Worker.Pools {
		if p.IsKubernetes() {
			out["worker-job/"+name] = asObject(t, workerJob(t, c, name)).get("spec", "template", "spec").(map[string]any)
		}
	}
	return out
}

// loadConfig is the rendered config file as the controlplane loads it.
func loadConfig(t testing.TB, r rendered) *config.Config {
	t.Helper()
	text, _ := controlplaneConfig(t, r)
	c, err := config.Load(strings.NewReader(text), nil)
	if err != nil {
		t.Fatalf("the controlplane refuses the rendered config: %v\n%s", err, text)
	}
	return c
}

// workerJob is the Job the controlplane builds (controlplane/tasks,
// Workers.create) for a pool with provider kubernetes of config c, for work
// the size of the pool's shape.
func workerJob(t testing.TB, c *config.Config, pool string) *batchv1.Job {
	t.Helper()
	p, ok := c.Worker.Pools[pool]
	if !ok || !p.IsKubernetes() {
		t.Fatalf("pool %s is not a pool with provider kubernetes in the config: %+v", pool, p)
	}
	var tol []corev1.Toleration
	for _, tl := range p.Tolerations {
		tol = append(tol, corev1.Toleration{Key: tl.Key, Operator: corev1.TolerationOperator(tl.Operator), Value: tl.Value, Effect: corev1.TaintEffect(tl.Effect)})
	}
	k := c.Worker.Kubernetes
	return kubeworkers.BuildJob(k.Namespace, kubeworkers.Spec{Pool: pool, MachineID: "m_charttest0000000", Image: c.Worker.WorkerImage(),
		Controlplane: k.Controlplane, CPUMillis: p.Shape.Millis(), MemoryBytes: p.Shape.Bytes(), GPUs: p.Shape.GPUs,
		Enforced: *c.Worker.JobResourcesEnforced, NodeSelector: p.NodeSelector, Tolerations: tol, RuntimeClassName: p.RuntimeClassName,
		IdleTimeout: p.Idle(), PodAnnotations: p.PodAnnotations, AgentArgs: k.AgentArgs, ImagePullSecrets: k.ImagePullSecrets})
}

// asObject is v as the rendered objects are: its YAML, parsed.
func asObject(t testing.TB, v any) object {
	t.Helper()
	b, err := yaml.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var o object
	if err := yaml.Unmarshal(b, &o); err != nil {
		t.Fatal(err)
	}
	return o
}

// controlplaneConfig is the config file the ConfigMap carries, parsed.
func controlplaneConfig(t testing.TB, r rendered) (string, map[string]any) {
	t.Helper()
	cm := r.find(t, "ConfigMap", "levers9-controlplane-config")
	text, _ := cm.get("data", "controlplane.yaml").(string)
	var c map[string]any
	if err := yaml.Unmarshal([]byte(text), &c); err != nil {
		t.Fatalf("controlplane.yaml: %v", err)
	}
	return text, c
}

// toYAML is for failure messages.
func toYAML(v any) string {
	b, _ := yaml.Marshal(v)
	return string(bytes.TrimSpace(b))
}
