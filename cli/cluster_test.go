package cli

import (
	"regexp"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/levers9/levers9/enroll"
	"github.com/levers9/levers9/internal/kubecluster/kubetest"
	"github.com/levers9/levers9/internal/kubeworkers"
)

var clusterIDRe = regexp.MustCompile(`cluster agent (m_[a-z2-7]+)`)

func TestClusterJoinPrintsManifestListShowDelete(t *testing.T) {
	t.Parallel()
	b := adminCLI(t)

	out, errOut, code := b.run(t, "", nil, "cluster", "join", "--pool", "default", "--namespace", "team-a", "--image", "reg.example/w:1", "-o", "yaml")
	if code != 0 {
		t.Fatalf("cluster join: %s", errOut)
	}
	id := clusterIDRe.FindStringSubmatch(errOut)
	if id == nil {
		t.Fatalf("no cluster agent id on stderr: %q", errOut)
	}
	docs := strings.Split(out, "\n---\n")
	kinds := map[string]int{}
	var token string
	for _, d := range docs {
		var head struct {
			Kind     string
			Metadata struct{ Namespace string }
		}
		if err := yaml.Unmarshal([]byte(d), &head); err != nil {
			t.Fatalf("manifest document: %v", err)
		}
		kinds[head.Kind]++
		if head.Kind == "Secret" {
			var s corev1.Secret
			if err := yaml.Unmarshal([]byte(d), &s); err != nil {
				t.Fatal(err)
			}
			token = string(s.Data[enroll.ClusterTokenKey])
		}
		if head.Kind == "Deployment" {
			var dep appsv1.Deployment
			if err := yaml.Unmarshal([]byte(d), &dep); err != nil {
				t.Fatal(err)
			}
			c := dep.Spec.Template.Spec.Containers[0]
			if c.Image != "reg.example/w:1" || dep.Namespace != "team-a" || c.Env[0].Value != b.inst.Server.GRPCAddr() {
				t.Errorf("Deployment: image %s, namespace %s, env %v", c.Image, dep.Namespace, c.Env)
			}
		}
	}
	for _, k := range []string{"Namespace", "ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding", "Secret", "Deployment"} {
		if kinds[k] != 1 {
			t.Errorf("manifest has %d %s", kinds[k], k)
		}
	}
	if _, err := enroll.ParseJoinToken(token); err != nil {
		t.Fatalf("the Secret's token: %v", err)
	}
	if strings.Contains(errOut, token) {
		t.Error("token on stderr")
	}

	out, errOut, code = b.run(t, "", nil, "cluster", "list")
	if code != 0 || !strings.Contains(out, id[1]) || !strings.Contains(out, "team-a") || !strings.Contains(out, "pending") {
		t.Fatalf("cluster list: %d %s %s", code, out, errOut)
	}
	out, errOut, code = b.run(t, "", nil, "cluster", "show", id[1])
	if code != 0 || !regexp.MustCompile(`Namespace:\s+team-a`).MatchString(out) {
		t.Fatalf("cluster show: %d %s %s", code, out, errOut)
	}

	// A plain machine is not a cluster, and may not pretend to be one.
	out, errOut, code = b.run(t, "", nil, "machine", "create", "--pool", "default", "--name", "plain")
	if code != 0 {
		t.Fatal(errOut)
	}
	plain := regexp.MustCompile(`machine (m_[a-z2-7]+)`).FindStringSubmatch(out)[1]
	if out, _, _ := b.run(t, "", nil, "cluster", "list"); strings.Contains(out, plain) {
		t.Errorf("cluster list shows plain machine %s:\n%s", plain, out)
	}
	if _, errOut, code := b.run(t, "", nil, "cluster", "show", plain); code == 0 || !strings.Contains(errOut, "not an attached cluster") {
		t.Errorf("cluster show of a machine: %d %s", code, errOut)
	}
	if _, errOut, code := b.run(t, "", nil, "machine", "create", "--pool", "default", "--label", "levers9.dev/cluster-agent=true"); code == 0 ||
		!strings.Contains(errOut, "cluster-agent is set by") {
		t.Errorf("machine create with the cluster-agent label: %d %s", code, errOut)
	}

	// Joining a cluster takes an admin: a machine-join token may make
	// machines but not cluster agents.
	joiner, errOut, code := b.run(t, "", nil, "token", "create", "--name", "joiner", "--role", "machine-join")
	if code != 0 {
		t.Fatal(errOut)
	}
	asJoiner := map[string]string{"LEVERS9_TOKEN": strings.TrimSpace(joiner)}
	if _, errOut, code := b.run(t, "", asJoiner, "cluster", "join", "--pool", "default"); code == 0 || !strings.Contains(errOut, "admin") {
		t.Errorf("cluster join with a machine-join token: %d %s", code, errOut)
	}
	if _, errOut, code := b.run(t, "", asJoiner, "machine", "create", "--pool", "default"); code != 0 {
		t.Errorf("machine create with a machine-join token: %s", errOut)
	}

	out, errOut, code = b.run(t, "", nil, "cluster", "delete", id[1])
	if code != 0 || !strings.Contains(out, "revoked") {
		t.Fatalf("cluster delete: %d %s %s", code, out, errOut)
	}
	if out, _, _ := b.run(t, "", nil, "cluster", "list"); strings.Contains(out, id[1]) {
		t.Errorf("deleted cluster still listed:\n%s", out)
	}
}

// TestClusterJoinApplyAndRBAC applies the manifest to a real API server
// and asks it (SubjectAccessReview) what the agent's service account may
// do, then detaches the cluster with --uninstall.
func TestClusterJoinApplyAndRBAC(t *testing.T) {
	t.Parallel()
	kc := kubetest.Start(t)
	b := adminCLI(t)
	cs := kc.Clientset()
	ctx := t.Context()

	kube := []string{"--kubeconfig", kc.KubeconfigPath()}
	out, errOut, code := b.run(t, "", nil, append([]string{"cluster", "join", "--pool", "default", "--namespace", "l9cj", "--apply"}, kube...)...)
	if code != 0 {
		t.Fatalf("cluster join --apply: %s", errOut)
	}
	id := clusterIDRe.FindStringSubmatch(out)
	if id == nil {
		t.Fatalf("no cluster agent id in %q", out)
	}
	dep, err := cs.AppsV1().Deployments("l9cj").Get(ctx, enroll.ClusterAgentName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the agent's Deployment: %v", err)
	}
	if dep.Spec.Template.Spec.ServiceAccountName != enroll.ClusterAgentName {
		t.Errorf("Deployment runs as %q", dep.Spec.Template.Spec.ServiceAccountName)
	}
	sec, err := cs.CoreV1().Secrets("l9cj").Get(ctx, enroll.ClusterJoinSecret, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the join Secret: %v", err)
	}
	if _, err := enroll.ParseJoinToken(string(sec.Data[enroll.ClusterTokenKey])); err != nil {
		t.Errorf("join Secret token: %v", err)
	}

	// A second join of the same namespace updates in place (new token, same
	// Deployment whose selector cannot change).
	if _, errOut, code := b.run(t, "", nil, append([]string{"cluster", "join", "--pool", "default", "--namespace", "l9cj", "--apply"}, kube...)...); code != 0 {
		t.Fatalf("second cluster join --apply: %s", errOut)
	}
	sec2, err := cs.CoreV1().Secrets("l9cj").Get(ctx, enroll.ClusterJoinSecret, metav1.GetOptions{})
	if err != nil || string(sec2.Data[enroll.ClusterTokenKey]) == string(sec.Data[enroll.ClusterTokenKey]) {
		t.Errorf("second join did not replace the token (err %v)", err)
	}

	for _, tc := range []struct {
		verb, group, resource, sub, ns string
		want                           bool
	}{
		{"create", "batch", "jobs", "", "l9cj", true},
		{"delete", "batch", "jobs", "", "l9cj", true},
		{"watch", "", "pods", "", "l9cj", true},
		{"get", "", "pods", "log", "l9cj", true},
		{"create", "", "secrets", "", "l9cj", true},
		{"list", "", "nodes", "", "", true},
		{"get", "", "secrets", "", "l9cj", false},
		{"list", "", "secrets", "", "kube-system", false},
		{"get", "", "secrets", "", "default", false},
		{"create", "", "pods", "", "kube-system", false},
		{"create", "", "pods", "", "l9cj", false},
		{"create", "batch", "jobs", "", "default", false},
		{"update", "", "nodes", "", "", false},
		{"create", "rbac.authorization.k8s.io", "rolebindings", "", "l9cj", false},
	} {
		if got := kubetest.ServiceAccountCan(t, cs, "l9cj", enroll.ClusterAgentName, authorizationv1.ResourceAttributes{Verb: tc.verb, Group: tc.group,
			Resource: tc.resource, Subresource: tc.sub, Namespace: tc.ns}); got != tc.want {
			t.Errorf("service account may %s %s/%s in %q: %v, want %v", tc.verb, tc.resource, tc.sub, tc.ns, got, tc.want)
		}
	}

	// A worker Job the agent would have made goes with the cluster.
	job := kubeworkers.BuildJob("l9cj", kubeworkers.Spec{Pool: "default", MachineID: "m_cjtestworker", Image: "reg.example/w:1", Controlplane: "x:1"})
	if _, err := cs.BatchV1().Jobs("l9cj").Create(ctx, job, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	out, errOut, code = b.run(t, "", nil, append([]string{"cluster", "delete", id[1], "--uninstall"}, kube...)...)
	if code != 0 || !strings.Contains(out, "1 worker Job(s)") {
		t.Fatalf("cluster delete --uninstall: %d %s %s", code, out, errOut)
	}
	if _, err := cs.AppsV1().Deployments("l9cj").Get(ctx, enroll.ClusterAgentName, metav1.GetOptions{}); err == nil {
		t.Error("the agent's Deployment is still there")
	}
	if _, err := cs.RbacV1().ClusterRoles().Get(ctx, enroll.ClusterAgentName+"-l9cj", metav1.GetOptions{}); err == nil {
		t.Error("the ClusterRole is still there")
	}
	jobs, err := cs.BatchV1().Jobs("l9cj").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, j := range jobs.Items {
		if j.DeletionTimestamp == nil {
			t.Errorf("worker Job %s survived the uninstall", j.Name)
		}
	}
}
