package enroll

import (
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

func clusterParams(t *testing.T) ClusterParams {
	t.Helper()
	_, token, _ := MintJoinToken()
	return ClusterParams{MachineID: "m_abcdefghijklmnop", Pool: "gpu", Namespace: "team-a",
		Image: "registry.example/levers9-worker:v1", ControlplaneGRPC: "cp.example:1993",
		CAPEM: "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n", Token: token,
		ExpiresAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
}

func find[T runtime.Object](objs []runtime.Object) []T {
	var out []T
	for _, o := range objs {
		if v, ok := o.(T); ok {
			out = append(out, v)
		}
	}
	return out
}

func TestClusterManifestRBACIsNarrow(t *testing.T) {
	t.Parallel()
	objs, err := ClusterManifest(clusterParams(t))
	if err != nil {
		t.Fatal(err)
	}
	roles := find[*rbacv1.Role](objs)
	if len(roles) != 1 || roles[0].Namespace != "team-a" {
		t.Fatalf("want one Role in team-a, got %+v", roles)
	}
	allowed := map[string]string{ // group/resource -> verbs, exactly
		"batch/jobs": "create,get,list,watch,delete", "/pods": "get,list,watch",
		"/pods/log": "get", "/secrets": "create,delete",
	}
	got := map[string]string{}
	for _, r := range roles[0].Rules {
		if len(r.ResourceNames) > 0 || len(r.NonResourceURLs) > 0 {
			t.Errorf("unexpected rule shape %+v", r)
		}
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				got[g+"/"+res] = strings.Join(r.Verbs, ",")
			}
		}
	}
	if len(got) != len(allowed) {
		t.Errorf("Role grants %v, want exactly %v", got, allowed)
	}
	for k, v := range allowed {
		if got[k] != v {
			t.Errorf("Role on %s: verbs %q, want %q", k, got[k], v)
		}
	}
	for _, r := range roles[0].Rules {
		for _, v := range append(append([]string{}, r.Verbs...), r.Resources...) {
			if v == "*" {
				t.Errorf("wildcard in Role rule %+v", r)
			}
		}
	}

	crs := find[*rbacv1.ClusterRole](objs)
	if len(crs) != 1 || len(crs[0].Rules) != 1 {
		t.Fatalf("want one ClusterRole with one rule, got %+v", crs)
	}
	r := crs[0].Rules[0]
	if strings.Join(r.APIGroups, ",") != "" || strings.Join(r.Resources, ",") != "nodes" || strings.Join(r.Verbs, ",") != "get,list,watch" {
		t.Errorf("ClusterRole rule %+v: want read-only nodes", r)
	}
	if !strings.Contains(crs[0].Name, "team-a") {
		t.Errorf("ClusterRole name %q does not carry the namespace", crs[0].Name)
	}

	for _, rb := range find[*rbacv1.RoleBinding](objs) {
		if rb.RoleRef.Kind != "Role" || len(rb.Subjects) != 1 || rb.Subjects[0].Namespace != "team-a" || rb.Subjects[0].Name != ClusterAgentName {
			t.Errorf("RoleBinding %+v", rb)
		}
	}
	for _, crb := range find[*rbacv1.ClusterRoleBinding](objs) {
		if crb.RoleRef.Name != crs[0].Name || len(crb.Subjects) != 1 || crb.Subjects[0].Kind != "ServiceAccount" {
			t.Errorf("ClusterRoleBinding %+v", crb)
		}
	}
}

func TestClusterManifestTokenOnlyInSecret(t *testing.T) {
	t.Parallel()
	p := clusterParams(t)
	objs, err := ClusterManifest(p)
	if err != nil {
		t.Fatal(err)
	}
	secrets := find[*corev1.Secret](objs)
	if len(secrets) != 1 || string(secrets[0].Data[ClusterTokenKey]) != p.Token || string(secrets[0].Data[ClusterCAKey]) != p.CAPEM {
		t.Fatalf("join Secret: %+v", secrets)
	}
	deps := find[*appsv1.Deployment](objs)
	if len(deps) != 1 {
		t.Fatalf("want one Deployment, got %d", len(deps))
	}
	d := deps[0]
	pod := d.Spec.Template.Spec
	if pod.ServiceAccountName != ClusterAgentName || *d.Spec.Replicas != 1 || d.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType {
		t.Errorf("Deployment spec %+v", d.Spec)
	}
	c := pod.Containers[0]
	var carried []string
	carried = append(carried, c.Command...)
	carried = append(carried, c.Args...)
	for _, e := range c.Env {
		carried = append(carried, e.Value)
		if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			t.Errorf("env %s reads a Secret; the token goes in as a file only", e.Name)
		}
	}
	for i, s := range carried {
		if strings.Contains(s, p.Token) {
			t.Errorf("token in the Deployment's command, args or env (value %d)", i)
		}
	}
	if !strings.Contains(strings.Join(c.Command, " "), "levers9-agent cluster") {
		t.Errorf("command does not run the cluster agent: %q", c.Command)
	}
	if sc := c.SecurityContext; sc == nil || *sc.Privileged || *sc.AllowPrivilegeEscalation || len(sc.Capabilities.Drop) != 1 {
		t.Errorf("agent container security %+v: want unprivileged, all capabilities dropped", sc)
	}
	y, err := ManifestYAML(objs)
	if err != nil {
		t.Fatal(err)
	}
	// The YAML carries the token base64 in the Secret's data, never in clear.
	if strings.Contains(string(y), p.Token) {
		t.Error("token in clear in the YAML manifest")
	}
	for _, kind := range []string{"kind: Namespace", "kind: ServiceAccount", "kind: Role\n", "kind: RoleBinding", "kind: ClusterRole\n",
		"kind: ClusterRoleBinding", "kind: Secret", "kind: Deployment", "apiVersion: rbac.authorization.k8s.io/v1", "apiVersion: apps/v1"} {
		if !strings.Contains(string(y), kind) {
			t.Errorf("YAML lacks %q", kind)
		}
	}
	if n := strings.Count(string(y), "\n---\n"); n != len(objs)-1 {
		t.Errorf("YAML has %d separators for %d objects", n, len(objs))
	}
}

func TestClusterManifestRefusesBadInput(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		edit func(*ClusterParams)
		want string
	}{
		{"namespace", func(p *ClusterParams) { p.Namespace = "Not_A_Label" }, "namespace"},
		{"pool", func(p *ClusterParams) { p.Pool = "a b" }, "pool"},
		{"image", func(p *ClusterParams) { p.Image = "" }, "image"},
		{"token", func(p *ClusterParams) { p.Token = "nope" }, "token"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := clusterParams(t)
			tc.edit(&p)
			_, err := ClusterManifest(p)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want one naming %s", err, tc.want)
			}
			if strings.Contains(err.Error(), p.Token) && p.Token != "nope" {
				t.Error("token in error")
			}
		})
	}
}
