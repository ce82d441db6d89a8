package helmchart

import (
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/levers9/levers9/controlplane/config"
	"github.com/levers9/levers9/internal/kubeworkers"
)

func TestRequiredValuesNamed(t *testing.T) {
	t.Parallel()
	required := []string{
		"images.controlplane.repository",
		"config.worker.imageRegistry",
		"config.imageService.runner.baseImageRegistry",
		"postgres.host",
		"redis.host",
	}
	for _, path := range required {
		t.Run(path, func(t *testing.T) {
			t.Parallel()
			_, err := render(t, with(baseValues(), path, nil))
			if err == nil || !strings.Contains(err.Error(), path+" is required") {
				t.Fatalf("render without %s: error %v, want one naming it", path, err)
			}
			for _, other := range required {
				if other != path && strings.Contains(err.Error(), other+" is required") {
					t.Errorf("error names %s, which is set: %v", other, err)
				}
			}
		})
	}
	t.Run("all at once", func(t *testing.T) {
		t.Parallel()
		_, err := render(t, map[string]any{})
		if err == nil {
			t.Fatal("rendered with no values")
		}
		for _, path := range required {
			if !strings.Contains(err.Error(), path+" is required") {
				t.Errorf("error does not name %s: %v", path, err)
			}
		}
	})
}

func TestConfigRefusesSecretLookingKeys(t *testing.T) {
	t.Parallel()
	for _, path := range []string{
		"config.controlplane.auth.bootstrapSecret",
		"config.controlplane.replicaSecret",
		"config.controlplane.metrics.token",
		"config.refusedPassword",
		"config.worker.pools.x.apiKey",
		"config.extra.encryptionKey",
		"config.extra.accessKeyId",
	} {
		t.Run(path, func(t *testing.T) {
			t.Parallel()
			_, err := render(t, with(baseValues(), path, "SENTINEL-IN-CONFIG"))
			if err == nil {
				t.Fatal("rendered a secret-looking key under config:")
			}
			msg := err.Error()
			if !strings.Contains(msg, path+" looks like a secret") || !strings.Contains(msg, "secrets.*") {
				t.Errorf("error %q does not name %s and the secret refs", msg, path)
			}
			if strings.Contains(msg, "SENTINEL-IN-CONFIG") {
				t.Errorf("the error repeats the secret value: %q", msg)
			}
		})
	}
	// Keys that merely contain "key" as a word part are not secrets.
	r := mustRender(t, with(baseValues(), "config.worker.containerSecurity.apparmorProfile", "levers9-default"))
	if _, c := controlplaneConfig(t, r); c["worker"] == nil {
		t.Error("worker config missing")
	}
}

func TestChartOwnedConfigKeysRefused(t *testing.T) {
	t.Parallel()
	for path, hint := range map[string]string{
		"config.database.postgres.host": "postgres: and redis:",
		"config.worker.pools.gpu":       "pools:",
		"config.controlplane.grpcAddr":  "ports are fixed",
	} {
		_, err := render(t, with(baseValues(), path, map[string]any{"x": "y"}))
		if err == nil || !strings.Contains(err.Error(), hint) {
			t.Errorf("%s: error %v, want a hint to use %s", path, err, hint)
		}
	}
}

// secretValues are sentinel values wherever the chart accepts a secret.
func secretValues() map[string]any {
	v := baseValues()
	for _, store := range []string{"images", "juicefs", "workspace"} {
		v = with(v, "objectStore."+store+".accessKeyId", sentinelAccessKey+"-"+store)
		v = with(v, "objectStore."+store+".secretAccessKey", sentinelSecretKey+"-"+store)
	}
	v = with(v, "secrets.replicaSecret.secretName", "levers9-replica")
	v = with(v, "secrets.metricsToken.secretName", "levers9-metrics")
	v = with(v, "secrets.previousEncryptionKeys.secretName", "levers9-encryption")
	v = with(v, "redis.existingSecret", "levers9-redis")
	v = with(v, "controlplane.tls.secretName", "levers9-tls")
	v = dashboardValues(v)
	v = with(v, "dashboard.api.envSecret.metricsTokenKey", "metrics-token")
	// A Kubernetes pool: its worker Job's pod spec is checked too.
	v = with(v, "pools.gpu", map[string]any{"provider": "kubernetes", "shape": map[string]any{"cpu": "4", "memory": "8Gi", "gpus": 1}})
	return v
}

func TestNoSecretValueOutsideSecrets(t *testing.T) {
	t.Parallel()
	r := mustRender(t, secretValues())
	isSentinel := regexp.MustCompile(`SENTINEL-`)

	// Secrets hold them (base64), and nothing else holds them in any form.
	secretData := 0
	for _, o := range r.objects {
		if o.kind() == "Secret" {
			data, _ := o["data"].(map[string]any)
			for _, v := range data {
				raw, err := base64.StdEncoding.DecodeString(v.(string))
				if err == nil && isSentinel.Match(raw) {
					secretData++
				}
			}
			continue
		}
		text := toYAML(o)
		if isSentinel.MatchString(text) {
			t.Errorf("%s %s holds a secret value:\n%s", o.kind(), o.name(), text)
		}
		for _, store := range []string{"images", "juicefs", "workspace"} {
			for _, s := range []string{sentinelAccessKey, sentinelSecretKey} {
				if strings.Contains(text, base64.StdEncoding.EncodeToString([]byte(s+"-"+store))) {
					t.Errorf("%s %s holds a secret value in base64", o.kind(), o.name())
				}
			}
		}
	}
	if secretData != 6 {
		t.Errorf("%d sentinel values in Secrets, want 6 (3 stores x 2 keys)", secretData)
	}

	// Every container: no literal env value or argument carries a secret,
	// and each secret env comes from a secretKeyRef.
	wantRefs := map[string]string{
		"LEVERS9_BOOTSTRAP_SECRET":                      "levers9-bootstrap/secret",
		"LEVERS9_ENCRYPTION_KEY":                        "levers9-encryption/key",
		"LEVERS9_PREVIOUS_ENCRYPTION_KEYS":              "levers9-encryption/previous",
		"LEVERS9_REPLICA_SECRET":                        "levers9-replica/secret",
		"LEVERS9_CONTROLPLANE_METRICS_TOKEN":            "levers9-metrics/token",
		"LEVERS9_POSTGRES_PASSWORD":                     "levers9-postgres/password",
		"LEVERS9_REDIS_PASSWORD":                        "levers9-redis/password",
		"LEVERS9_OBJECTSTORE_IMAGES_ACCESS_KEY_ID":      "levers9-objectstore-images/ACCESS_KEY_ID",
		"LEVERS9_OBJECTSTORE_JUICEFS_SECRET_ACCESS_KEY": "levers9-objectstore-juicefs/SECRET_ACCESS_KEY",
		"LEVERS9_OBJECTSTORE_WORKSPACE_ACCESS_KEY_ID":   "levers9-objectstore-workspace/ACCESS_KEY_ID",
		"LEVERS9_DASHBOARD_TOKEN":                       "levers9-dashboard-env/token",
		"LEVERS9_DASHBOARD_SESSION_SECRET":              "levers9-dashboard-env/session-secret",
		"LEVERS9_DASHBOARD_GOOGLE_CLIENT_SECRET":        "levers9-dashboard-env/google-client-secret",
		"LEVERS9_DASHBOARD_METRICS_TOKEN":               "levers9-dashboard-env/metrics-token",
	}
	secretName := regexp.MustCompile(`(?i)(password|secret|token|key)`)
	// $(VAR) (Kubernetes) or $VAR / ${VAR} (a shell) would put the secret
	// env's value into some process's argv.
	expandsSecret := regexp.MustCompile(`\$[({]?LEVERS9_[A-Z0-9_]*(PASSWORD|SECRET|TOKEN|KEY)`)
	gotRefs := map[string]string{}
	for where, spec := range podSpecs(t, r) {
		for _, c := range containers(spec) {
			for _, field := range []string{"args", "command"} {
				if s := toYAML(c[field]); isSentinel.MatchString(s) || expandsSecret.MatchString(s) {
					t.Errorf("%s: %s of %v carries a secret: %s", where, field, c["name"], s)
				}
			}
			env, _ := c["env"].([]any)
			for _, e := range env {
				e := e.(map[string]any)
				name, _ := e["name"].(string)
				if v, literal := e["value"]; literal {
					if isSentinel.MatchString(toYAML(v)) || secretName.MatchString(name) {
						t.Errorf("%s: env %s is a literal value, want a secretKeyRef", where, name)
					}
					continue
				}
				if ref, ok := e["valueFrom"].(map[string]any)["secretKeyRef"].(map[string]any); ok {
					gotRefs[name] = ref["name"].(string) + "/" + ref["key"].(string)
				}
			}
			if ef := c["envFrom"]; ef != nil {
				t.Errorf("%s: envFrom %s: env must name each secret", where, toYAML(ef))
			}
		}
	}
	for name, want := range wantRefs {
		if gotRefs[name] != want {
			t.Errorf("env %s from %q, want secretKeyRef %s", name, gotRefs[name], want)
		}
	}

	// The config file holds no secret and the controlplane accepts it.
	text, _ := controlplaneConfig(t, r)
	if isSentinel.MatchString(text) || regexp.MustCompile(`(?i)password|secret|token`).MatchString(text) {
		t.Errorf("the config file mentions a secret:\n%s", text)
	}
	if _, err := config.Load(strings.NewReader(text), nil); err != nil {
		t.Errorf("the controlplane refuses the rendered config: %v\n%s", err, text)
	}
}

func TestRBAC(t *testing.T) {
	t.Parallel()
	wide := func(o object) bool {
		rules, _ := o["rules"].([]any)
		for _, r := range rules {
			s := toYAML(r)
			if strings.Contains(s, `- '*'`) {
				return true
			}
		}
		return false
	}
	for _, legacy := range []bool{false, true} {
		r := mustRender(t, with(baseValues(), "rbac.legacyClusterWide", legacy))
		nodes := r.find(t, "ClusterRole", "levers9-controlplane-nodes-levers9")
		if s := toYAML(nodes["rules"]); !strings.Contains(s, "nodes") || strings.Contains(s, "create") {
			t.Errorf("nodes ClusterRole rules:\n%s", s)
		}
		role := r.find(t, "Role", "levers9-controlplane-workers")
		if ns := role.get("metadata", "namespace"); ns != "levers9-workers" {
			t.Errorf("worker Role in namespace %v", ns)
		}
		rules := toYAML(role["rules"])
		for _, want := range []string{"jobs", "pods/log", "secrets", "create", "delete"} {
			if !strings.Contains(rules, want) {
				t.Errorf("worker Role lacks %s:\n%s", want, rules)
			}
		}
		var wideRoles []string
		for _, o := range r.objects {
			if (o.kind() == "ClusterRole" || o.kind() == "Role") && wide(o) {
				wideRoles = append(wideRoles, o.name())
			}
		}
		switch {
		case !legacy && len(wideRoles) > 0:
			t.Errorf("legacyClusterWide=false renders wide roles %v", wideRoles)
		case legacy && (len(wideRoles) != 1 || wideRoles[0] != "levers9-controlplane-legacy-levers9"):
			t.Errorf("legacyClusterWide=true renders wide roles %v", wideRoles)
		case legacy:
			b := r.find(t, "ClusterRoleBinding", "levers9-controlplane-legacy-levers9")
			if s := toYAML(b["subjects"]); !strings.Contains(s, "name: levers9-controlplane") || !strings.Contains(s, "namespace: levers9") {
				t.Errorf("legacy binding subjects:\n%s", s)
			}
		}
	}
}

func TestTunnelService(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		vals     map[string]any
		wantType string
		nodePort any
	}{
		{"default LoadBalancer", baseValues(), "LoadBalancer", nil},
		{"NodePort", with(with(baseValues(), "tunnel.service.type", "NodePort"), "tunnel.service.nodePort", 31995), "NodePort", float64(31995)},
		{"NodePort picked", with(baseValues(), "tunnel.service.type", "NodePort"), "NodePort", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := mustRender(t, tc.vals)
			svc := r.find(t, "Service", "levers9-tunnel")
			if got := svc.get("spec", "type"); got != tc.wantType {
				t.Errorf("type %v, want %s", got, tc.wantType)
			}
			protos := map[string]bool{}
			for _, p := range svc.get("spec", "ports").([]any) {
				p := p.(map[string]any)
				if p["port"] != float64(1995) {
					t.Errorf("tunnel port %v", p["port"])
				}
				if p["nodePort"] != tc.nodePort {
					t.Errorf("nodePort %v, want %v", p["nodePort"], tc.nodePort)
				}
				protos[p["protocol"].(string)] = true
			}
			if !protos["TCP"] || !protos["UDP"] {
				t.Errorf("tunnel protocols %v, want TCP and UDP", protos)
			}
			in := r.find(t, "Service", "levers9-controlplane")
			if in.get("spec", "type") != "ClusterIP" || !strings.Contains(toYAML(in.get("spec", "ports")), "1993") ||
				!strings.Contains(toYAML(in.get("spec", "ports")), "1994") {
				t.Errorf("controlplane Service:\n%s", toYAML(in["spec"]))
			}
		})
	}
	if _, err := render(t, with(baseValues(), "tunnel.service.type", "ClusterIP")); err == nil {
		t.Error("a ClusterIP tunnel rendered: agents outside could not reach it")
	}
}

func TestJobResourcesEnforced(t *testing.T) {
	t.Parallel()
	pools := map[string]any{
		"default": map[string]any{"provider": "kubernetes", "nodeSelector": map[string]any{"levers9.dev/pool": "default"},
			"shape": map[string]any{"cpu": "1", "memory": "2Gi"}},
		"l40s": map[string]any{"provider": "kubernetes", "nodeSelector": map[string]any{"nvidia.com/gpu.product": "NVIDIA-L40S"},
			"shape": map[string]any{"cpu": "8", "memory": "64Gi", "gpus": 1}},
	}
	for _, enforced := range []bool{true, false} {
		vals := with(with(baseValues(), "pools", pools), "config.worker.jobResourcesEnforced", enforced)
		r := mustRender(t, vals)
		_, raw := controlplaneConfig(t, r)
		if got := raw["worker"].(map[string]any)["jobResourcesEnforced"]; got != enforced {
			t.Errorf("config worker.jobResourcesEnforced = %v, want %v", got, enforced)
		}
		c := loadConfig(t, r)
		for pool := range pools {
			job := workerJob(t, c, pool)
			spec := job.Spec.Template.Spec
			ctr := spec.Containers[0]
			if ctr.SecurityContext == nil || ctr.SecurityContext.Privileged == nil || !*ctr.SecurityContext.Privileged {
				t.Errorf("%s: worker pod not privileged", pool)
			}
			if job.Namespace != "levers9-workers" {
				t.Errorf("%s: worker Job in namespace %v", pool, job.Namespace)
			}
			if got, want := toYAML(spec.NodeSelector), toYAML(pools[pool].(map[string]any)["nodeSelector"]); got != want {
				t.Errorf("%s: worker nodeSelector %s, want %s", pool, got, want)
			}
			res := ctr.Resources
			if !enforced {
				if len(res.Requests) > 0 || len(res.Limits) > 0 {
					t.Errorf("%s: jobResourcesEnforced=false, resources %s", pool, toYAML(res))
				}
				continue
			}
			req, lim := res.Requests, res.Limits
			gpu := func(l corev1.ResourceList) string {
				if q, ok := l[kubeworkers.GPUResource]; ok {
					return q.String()
				}
				return ""
			}
			switch pool {
			case "l40s":
				if req.Cpu().String() != "8" || req.Memory().String() != "64Gi" || gpu(req) != "1" || gpu(lim) != "1" {
					t.Errorf("l40s resources %s", toYAML(res))
				}
			case "default":
				if req.Cpu().String() != "1" || req.Memory().String() != "2Gi" || gpu(req) != "" {
					t.Errorf("default resources %s", toYAML(res))
				}
			}
		}
	}
}

func TestControlplaneSecurityContext(t *testing.T) {
	t.Parallel()
	check := func(t *testing.T, r rendered, readOnly bool) {
		t.Helper()
		d := r.find(t, "Deployment", "levers9-controlplane")
		c := containers(d.get("spec", "template", "spec").(map[string]any))[0]
		sc := c["securityContext"].(map[string]any)
		want := map[string]any{"runAsNonRoot": true, "privileged": false, "allowPrivilegeEscalation": false,
			"readOnlyRootFilesystem": readOnly, "runAsUser": float64(65532)}
		for k, v := range want {
			if sc[k] != v {
				t.Errorf("securityContext.%s = %v, want %v", k, sc[k], v)
			}
		}
		if caps := toYAML(sc["capabilities"]); caps != "drop:\n- ALL" {
			t.Errorf("capabilities %s, want every one dropped", caps)
		}
		if ps := d.get("spec", "template", "spec", "securityContext", "runAsNonRoot"); ps != true {
			t.Errorf("pod runAsNonRoot = %v", ps)
		}
	}
	check(t, mustRender(t, baseValues()), true)
	// Changing one key keeps the others.
	check(t, mustRender(t, with(baseValues(), "controlplane.securityContext.readOnlyRootFilesystem", false)), false)
}

func TestControlplaneDeployment(t *testing.T) {
	t.Parallel()
	r := mustRender(t, with(with(baseValues(), "controlplane.tls.secretName", "levers9-tls"), "controlplane.tls.caKey", "ca.crt"))
	d := r.find(t, "Deployment", "levers9-controlplane")
	if d.get("spec", "replicas") != float64(2) {
		t.Errorf("replicas %v, want 2", d.get("spec", "replicas"))
	}
	spec := d.get("spec", "template", "spec").(map[string]any)
	if spec["serviceAccountName"] != "levers9-controlplane" {
		t.Errorf("serviceAccountName %v", spec["serviceAccountName"])
	}
	c := containers(spec)[0]
	for _, probe := range []string{"startupProbe", "readinessProbe", "livenessProbe"} {
		get, _ := c[probe].(map[string]any)["httpGet"].(map[string]any)
		if get["path"] != "/healthz" || get["scheme"] != "HTTPS" {
			t.Errorf("%s %s, want HTTPS /healthz", probe, toYAML(get))
		}
	}
	if res := toYAML(c["resources"]); !strings.Contains(res, "requests") || !strings.Contains(res, "limits") {
		t.Errorf("resources %s", res)
	}
	if args := toYAML(c["args"]); args != "- --config\n- /etc/levers9/config/controlplane.yaml" {
		t.Errorf("args %s", args)
	}
	pdb := r.find(t, "PodDisruptionBudget", "levers9-controlplane")
	if pdb.get("spec", "minAvailable") != float64(1) {
		t.Errorf("PDB %s", toYAML(pdb["spec"]))
	}
	_, cfg := controlplaneConfig(t, r)
	tls := toYAML(cfg["controlplane"].(map[string]any)["tls"])
	if !strings.Contains(tls, "/etc/levers9/tls/tls.crt") || !strings.Contains(tls, "caFile: /etc/levers9/tls/ca.crt") {
		t.Errorf("config tls %s", tls)
	}
	if !strings.Contains(toYAML(spec["volumes"]), "secretName: levers9-tls") {
		t.Errorf("TLS Secret not mounted: %s", toYAML(spec["volumes"]))
	}
	// Without TLS the probes speak plain HTTP.
	r = mustRender(t, baseValues())
	c = containers(r.find(t, "Deployment", "levers9-controlplane").get("spec", "template", "spec").(map[string]any))[0]
	if s := c["readinessProbe"].(map[string]any)["httpGet"].(map[string]any)["scheme"]; s != "HTTP" {
		t.Errorf("probe scheme without TLS %v", s)
	}
}

// The EKS example values render, their pools reach the controlplane's
// worker.pools with their nodeSelectors, the controlplane accepts the
// config file as is, and the l40s pool's worker Job tolerates the GPU
// taint and requests the GPU.
func TestExampleValuesPools(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile(filepath.Join(chartDir(t), "..", "..", "eks", "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var vals map[string]any
	if err := yaml.Unmarshal(raw, &vals); err != nil {
		t.Fatalf("eks/values.yaml: %v", err)
	}
	r := mustRender(t, vals)
	text, _ := controlplaneConfig(t, r)
	c, err := config.Load(strings.NewReader(text), nil)
	if err != nil {
		t.Fatalf("the controlplane refuses the rendered config: %v\n%s", err, text)
	}
	for _, pool := range []string{"default", "build", "l40s"} {
		p, ok := c.Worker.Pools[pool]
		if !ok {
			t.Errorf("pool %s missing from worker.pools", pool)
			continue
		}
		if len(p.NodeSelector) == 0 {
			t.Errorf("pool %s has no nodeSelector", pool)
		}
	}
	if c.ImageService.Runner.BaseImageRegistry == "" || c.Worker.ImageRegistry == "" {
		t.Errorf("registries lost: %+v %+v", c.ImageService, c.Worker.ImageRegistry)
	}
	job := workerJob(t, c, "l40s")
	if got := toYAML(job.Spec.Template.Spec.Tolerations); !strings.Contains(got, "nvidia.com/gpu") {
		t.Errorf("l40s worker tolerations %s", got)
	}
	if q := job.Spec.Template.Spec.Containers[0].Resources.Requests[kubeworkers.GPUResource]; q.Value() != 1 {
		t.Errorf("l40s worker pod requests %s GPUs, want 1", q.String())
	}
}

func TestSchemaChecksTypes(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		path string
		v    any
		want string
	}{
		{"controlplane.replicas", "two", "replicas"},
		{"rbac.legacyClusterWide", "yes", "legacyClusterWide"},
		{"tunnel.service.nodePort", "x", "nodePort"},
		{"postgres.port", 70000, "port"},
		{"unknownTopLevel", true, "unknownTopLevel"},
		{"pools.gpu.runtime", "docker", "runtime"},
		{"config.worker.jobResourcesEnforced", "sometimes", "jobResourcesEnforced"},
	} {
		_, err := render(t, with(baseValues(), tc.path, tc.v))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s=%v: error %v, want a schema error naming %s", tc.path, tc.v, err, tc.want)
		}
	}
}

func TestGVisorRuntimeClass(t *testing.T) {
	t.Parallel()
	if r := mustRender(t, baseValues()); r.has("RuntimeClass", "gvisor") {
		t.Error("RuntimeClass rendered without being asked")
	}
	vals := with(with(baseValues(), "gvisor.runtimeClass.create", true),
		"pools", map[string]any{"sandboxed": map[string]any{"provider": "kubernetes", "runtimeClassName": "gvisor", "runtime": "runsc",
			"shape": map[string]any{"cpu": "2", "memory": "4Gi"}}})
	r := mustRender(t, vals)
	if rc := r.find(t, "RuntimeClass", "gvisor"); rc["handler"] != "runsc" {
		t.Errorf("handler %v", rc["handler"])
	}
	if got := workerJob(t, loadConfig(t, r), "sandboxed").Spec.Template.Spec.RuntimeClassName; got == nil || *got != "gvisor" {
		t.Errorf("worker runtimeClassName %v", got)
	}
}

// TestKubernetesPoolConfig: a pool with provider kubernetes reaches the
// controlplane with its worker keys, worker.kubernetes points at the
// chart's worker namespace, worker image and controlplane Service, the
// controlplane accepts the result, and the worker Job the controlplane
// builds from it (kubeworkers.BuildJob) runs the join command with the
// pool's idle exit, image and pull Secret.
func TestKubernetesPoolConfig(t *testing.T) {
	t.Parallel()
	pools := map[string]any{
		"default": map[string]any{"nodeSelector": map[string]any{"levers9.dev/pool": "default"}},
		"l40s": map[string]any{"provider": "kubernetes", "maxWorkers": 3, "idleTimeout": "2m",
			"shape":        map[string]any{"cpu": "8", "memory": "64Gi", "gpus": 4},
			"nodeSelector": map[string]any{"nvidia.com/gpu.product": "NVIDIA-L40S"},
			"tolerations":  []any{map[string]any{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}}},
	}
	r := mustRender(t, with(with(baseValues(), "pools", pools), "images.pullSecrets", []any{"regcred"}))
	text, _ := controlplaneConfig(t, r)
	c, err := config.Load(strings.NewReader(text), nil)
	if err != nil {
		t.Fatalf("the controlplane refuses the rendered config: %v\n%s", err, text)
	}
	p := c.Worker.Pools["l40s"]
	if !p.IsKubernetes() || p.MaxWorkers != 3 || p.Shape.GPUs != 4 || p.Shape.Bytes() != 64<<30 || len(p.Tolerations) != 1 || p.IdleTimeout != "2m" {
		t.Errorf("pool l40s = %+v", p)
	}
	k := c.Worker.Kubernetes
	if k.Namespace != "levers9-workers" || !strings.Contains(k.Image, "levers9-worker") || !strings.HasPrefix(k.Controlplane, "levers9-controlplane.") ||
		len(k.ImagePullSecrets) != 1 || k.ImagePullSecrets[0] != "regcred" {
		t.Errorf("worker.kubernetes = %+v", k)
	}
	job := workerJob(t, c, "l40s")
	spec := job.Spec.Template.Spec
	ctr := spec.Containers[0]
	script := fmt.Sprint(ctr.Command)
	for _, want := range []string{"--exit-when-idle", "/etc/levers9/join/token", "ca.crt"} {
		if !strings.Contains(script, want) {
			t.Errorf("worker command %s lacks %q", script, want)
		}
	}
	env := map[string]string{}
	for _, e := range ctr.Env {
		env[e.Name] = e.Value
	}
	if d, err := time.ParseDuration(env[kubeworkers.EnvIdle]); err != nil || d != 2*time.Minute || env[kubeworkers.EnvCP] != k.Controlplane || env["LEVERS9_POOL"] != "l40s" {
		t.Errorf("worker env = %v", ctr.Env)
	}
	if len(spec.ImagePullSecrets) != 1 || spec.ImagePullSecrets[0].Name != "regcred" || ctr.Image != k.Image || len(spec.Tolerations) != 1 {
		t.Errorf("worker pod spec = %s", toYAML(spec))
	}
}
