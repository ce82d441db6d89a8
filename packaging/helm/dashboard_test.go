package helmchart

import (
	"slices"
	"strings"
	"testing"
)

// dashboardValues turns the dashboard on with every value it requires.
func dashboardValues(v map[string]any) map[string]any {
	v = with(v, "dashboard.enabled", true)
	v = with(v, "dashboard.api.publicUrl", "https://levers9-api.example.com")
	v = with(v, "dashboard.web.url", "https://levers9.example.com")
	v = with(v, "dashboard.api.googleClientId", "1234-abc.apps.googleusercontent.com")
	v = with(v, "dashboard.api.allowedDomains", []any{"example.com", "example.org"})
	v = with(v, "dashboard.api.admins", []any{"ops@example.com", "@example.org"})
	return v
}

// envOf returns a container's literal env values and its secretKeyRefs
// (NAME -> secret/key).
func envOf(c map[string]any) (map[string]string, map[string]string) {
	lit, refs := map[string]string{}, map[string]string{}
	env, _ := c["env"].([]any)
	for _, e := range env {
		e := e.(map[string]any)
		name, _ := e["name"].(string)
		if v, ok := e["value"].(string); ok {
			lit[name] = v
			continue
		}
		if ref, ok := e["valueFrom"].(map[string]any)["secretKeyRef"].(map[string]any); ok {
			refs[name] = ref["name"].(string) + "/" + ref["key"].(string)
		}
	}
	return lit, refs
}

func TestDashboardOffByDefault(t *testing.T) {
	t.Parallel()
	r := mustRender(t, baseValues())
	for _, name := range []string{"levers9-dashboard-api", "levers9-dashboard-web"} {
		for _, kind := range []string{"Deployment", "Service"} {
			if r.has(kind, name) {
				t.Errorf("%s %s rendered without dashboard.enabled", kind, name)
			}
		}
	}
}

func TestDashboardRequiredValuesNamed(t *testing.T) {
	t.Parallel()
	required := []string{"dashboard.api.publicUrl", "dashboard.web.url", "dashboard.api.googleClientId",
		"dashboard.api.allowedDomains", "dashboard.api.admins", "dashboard.api.envSecret.secretName"}
	_, err := render(t, with(baseValues(), "dashboard.enabled", true))
	if err == nil {
		t.Fatal("rendered an enabled dashboard without its values")
	}
	// envSecret.secretName has a default (levers9-dashboard-env).
	for _, path := range required[:len(required)-1] {
		if !strings.Contains(err.Error(), path+" is required") {
			t.Errorf("error does not name %s: %v", path, err)
		}
	}
	for _, path := range required {
		t.Run(path, func(t *testing.T) {
			t.Parallel()
			v := dashboardValues(baseValues())
			if path == "dashboard.api.envSecret.secretName" {
				v = with(v, path, "")
			} else {
				v = with(v, path, nil)
			}
			_, err := render(t, v)
			if err == nil || !strings.Contains(err.Error(), path+" is required") {
				t.Fatalf("render without %s: %v, want an error naming it", path, err)
			}
		})
	}
	if _, err := render(t, with(dashboardValues(baseValues()), "dashboard.api.publicUrl", "levers9-api.example.com")); err == nil {
		t.Error("the schema took a publicUrl without a scheme")
	}
}

func TestDashboard(t *testing.T) {
	t.Parallel()
	v := dashboardValues(baseValues())
	v = with(v, "dashboard.api.cookieDomain", "example.com")
	r := mustRender(t, v)

	api := r.find(t, "Deployment", "levers9-dashboard-api")
	spec := api.get("spec", "template", "spec").(map[string]any)
	c := containers(spec)[0]
	if c["image"] != "registry.example.com/levers9/levers9-dashboard-api:latest" {
		t.Errorf("api image %v, want levers9-dashboard-api beside the controlplane's", c["image"])
	}
	lit, refs := envOf(c)
	wantLit := map[string]string{
		"LEVERS9_DASHBOARD_CONTROLPLANE":     "levers9-controlplane:1993",
		"LEVERS9_DASHBOARD_ADDR":             ":1997",
		"LEVERS9_DASHBOARD_PUBLIC_URL":       "https://levers9-api.example.com",
		"LEVERS9_DASHBOARD_WEB_URL":          "https://levers9.example.com",
		"LEVERS9_DASHBOARD_GOOGLE_CLIENT_ID": "1234-abc.apps.googleusercontent.com",
		"LEVERS9_DASHBOARD_ALLOWED_DOMAINS":  "example.com,example.org",
		"LEVERS9_DASHBOARD_ADMINS":           "ops@example.com,@example.org",
		"LEVERS9_DASHBOARD_COOKIE_DOMAIN":    "example.com",
	}
	for k, want := range wantLit {
		if lit[k] != want {
			t.Errorf("env %s = %q, want %q", k, lit[k], want)
		}
	}
	wantRefs := map[string]string{
		"LEVERS9_DASHBOARD_TOKEN":                "levers9-dashboard-env/token",
		"LEVERS9_DASHBOARD_SESSION_SECRET":       "levers9-dashboard-env/session-secret",
		"LEVERS9_DASHBOARD_GOOGLE_CLIENT_SECRET": "levers9-dashboard-env/google-client-secret",
	}
	for k, want := range wantRefs {
		if refs[k] != want {
			t.Errorf("env %s from %q, want secretKeyRef %s", k, refs[k], want)
		}
	}
	for _, k := range []string{"LEVERS9_DASHBOARD_METRICS_TOKEN", "LEVERS9_DASHBOARD_DEV_SIGNIN", "LEVERS9_DASHBOARD_CONTROLPLANE_TLS"} {
		if _, ok := lit[k]; ok || refs[k] != "" {
			t.Errorf("env %s set by default", k)
		}
	}
	if get, _ := c["readinessProbe"].(map[string]any)["httpGet"].(map[string]any); get["path"] != "/healthz" || get["port"] != "http" {
		t.Errorf("api readiness probe %s, want /healthz", toYAML(c["readinessProbe"]))
	}
	for _, probe := range []string{"startupProbe", "livenessProbe"} {
		if c[probe] == nil {
			t.Errorf("api has no %s", probe)
		}
	}

	web := r.find(t, "Deployment", "levers9-dashboard-web")
	wspec := web.get("spec", "template", "spec").(map[string]any)
	wc := containers(wspec)[0]
	if wc["image"] != "registry.example.com/levers9/levers9-dashboard-web:latest" {
		t.Errorf("web image %v", wc["image"])
	}
	if wc["env"] != nil || wc["args"] != nil {
		t.Errorf("web container has env or args (it needs none): %s %s", toYAML(wc["env"]), toYAML(wc["args"]))
	}

	for name, s := range map[string]map[string]any{"api": spec, "web": wspec} {
		sc := toYAML(containers(s)[0]["securityContext"])
		for _, want := range []string{"runAsNonRoot: true", "readOnlyRootFilesystem: true", "allowPrivilegeEscalation: false", "- ALL"} {
			if !strings.Contains(sc, want) {
				t.Errorf("%s securityContext lacks %q:\n%s", name, want, sc)
			}
		}
		if s["automountServiceAccountToken"] != false {
			t.Errorf("%s mounts a service account token", name)
		}
		if !strings.Contains(toYAML(s["volumes"]), "emptyDir") {
			t.Errorf("%s has no emptyDir for /tmp", name)
		}
	}

	// Services: ClusterIP, each selecting its own pods only.
	cpSel := toYAML(r.find(t, "Service", "levers9-controlplane").get("spec", "selector"))
	for name, port := range map[string]float64{"levers9-dashboard-api": 1997, "levers9-dashboard-web": 80} {
		svc := r.find(t, "Service", name)
		if svc.get("spec", "type") != "ClusterIP" {
			t.Errorf("%s type %v", name, svc.get("spec", "type"))
		}
		sel := toYAML(svc.get("spec", "selector"))
		d := r.find(t, "Deployment", name)
		if sel != toYAML(d.get("spec", "selector", "matchLabels")) || sel == cpSel {
			t.Errorf("%s selects %s; its Deployment %s; the controlplane %s", name, sel, toYAML(d.get("spec", "selector", "matchLabels")), cpSel)
		}
		ports, _ := svc.get("spec", "ports").([]any)
		if len(ports) != 1 || ports[0].(map[string]any)["port"] != port {
			t.Errorf("%s ports %s, want %v", name, toYAML(ports), port)
		}
	}

	// Images pinned by digest, and TLS to the controlplane with only its CA mounted.
	digest := "sha256:" + strings.Repeat("ab", 32)
	v = with(v, "images.dashboardApi.digest", digest)
	v = with(v, "images.dashboardWeb.repository", "other.example.com/web")
	v = with(with(v, "controlplane.tls.secretName", "levers9-tls"), "controlplane.tls.caKey", "ca.crt")
	r = mustRender(t, v)
	spec = r.find(t, "Deployment", "levers9-dashboard-api").get("spec", "template", "spec").(map[string]any)
	c = containers(spec)[0]
	if c["image"] != "registry.example.com/levers9/levers9-dashboard-api@"+digest {
		t.Errorf("api image %v, want the digest", c["image"])
	}
	if img := containers(r.find(t, "Deployment", "levers9-dashboard-web").get("spec", "template", "spec").(map[string]any))[0]["image"]; img != "other.example.com/web:latest" {
		t.Errorf("web image %v", img)
	}
	lit, _ = envOf(c)
	if lit["LEVERS9_DASHBOARD_CONTROLPLANE_TLS"] != "true" || lit["LEVERS9_DASHBOARD_CONTROLPLANE_CA"] != "/etc/levers9/controlplane-ca/ca.crt" {
		t.Errorf("TLS env %v", lit)
	}
	vols := toYAML(spec["volumes"])
	if !strings.Contains(vols, "secretName: levers9-tls") || strings.Contains(vols, "tls.key") {
		t.Errorf("the api mounts more of the TLS Secret than its CA:\n%s", vols)
	}
	if names := slices.Collect(func(yield func(string) bool) {
		for _, o := range r.objects {
			if o.kind() == "ConfigMap" && strings.Contains(o.name(), "dashboard") && !yield(o.name()) {
				return
			}
		}
	}); len(names) > 0 {
		t.Errorf("dashboard ConfigMaps %v: its settings are env", names)
	}
}
