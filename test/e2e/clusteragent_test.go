package e2e

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/client-go/util/retry"

	"github.com/levers9/levers9/controlplane/config"
	"github.com/levers9/levers9/controlplane/controlplanetest"
	"github.com/levers9/levers9/enroll"
	"github.com/levers9/levers9/internal/kubecluster"
	"github.com/levers9/levers9/internal/kubecluster/kubetest"
	"github.com/levers9/levers9/internal/kubeworkers"
)

const caNamespace = "l9ca"

var caIDRe = regexp.MustCompile(`cluster agent (m_[a-z2-7]+)`)

// TestClusterAgent attaches the test API server to a pool with `cluster
// join --apply` and runs the cluster agent the manifest deploys: the
// stand-in kubelet runs the Deployment's pod as a local process (the
// agent binary built for the test) whose only Kubernetes credential is a
// token minted for the levers9-cluster-agent ServiceAccount:
//
//   - the agent joins, reports the nodes (the sum and the largest) and
//     `cluster show` prints them; a task bigger than any node is refused;
//   - a task of the pool runs on a worker Job the agent made in its
//     namespace (as that ServiceAccount), its output reaches `levers9
//     run`, and it gets the worker-wide security, not the pool's override;
//   - the worker pod deleted mid-task loses the attempt at once (the
//     agent's pod watch, well within lostAgentGrace), a new worker runs it
//     again and the follower exits with the task's code;
//   - SubjectAccessReview: the ServiceAccount may make Jobs and Secrets in
//     its namespace and read nodes, may not read Secrets nor touch other
//     namespaces; the controlplane's config names no cluster credential;
//   - `cluster delete` has the agent remove its Jobs, then revokes it.
func TestClusterAgent(t *testing.T) {
	kc := kubetest.Start(t)
	kube := kc.Clientset()
	ctx := context.Background()
	w := &taskWorld{runs: map[string]machineRun{}}
	w.joinWorld = setupJoinWorldWith(t, func(c *config.Config) {
		// Long: a lost attempt must come from the pod watch, not the grace.
		c.Controlplane.LostAgentGrace = "2m"
		w.demoImage(t, c)
		c.Worker.Kubernetes.AgentArgs = []string{"--insecure-registries", w.registry}
		no := false
		// The pool's own override, which the cluster's workers must not take.
		c.Worker.Pools["attached"] = config.Pool{Runtime: "runc", Security: config.ContainerSecurity{DropNetRaw: &no}}
	})
	if k := w.in.Config.Worker.Kubernetes; k.Kubeconfig != "" {
		t.Fatalf("the controlplane has a kubeconfig: %s", k.Kubeconfig)
	}

	out, errOut, err := w.cli(t, "cluster", "join", "--pool", "attached", "--namespace", caNamespace, "--apply", "--kubeconfig", kc.KubeconfigPath())
	if err != nil {
		t.Fatalf("cluster join --apply: %v\n%s%s", err, out, errOut)
	}
	if strings.Contains(out+errOut, "preview") {
		t.Errorf("cluster join still says preview:\n%s%s", out, errOut)
	}
	m := caIDRe.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no cluster agent id in %q", out)
	}
	agentID := m[1]

	// The agent's only credential: a token of its ServiceAccount.
	tok, err := kube.CoreV1().ServiceAccounts(caNamespace).CreateToken(ctx, enroll.ClusterAgentName,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("TokenRequest for %s: %v", enroll.ClusterAgentName, err)
	}
	rc := kc.RESTConfig()
	ca := rc.CAData
	if len(ca) == 0 {
		if ca, err = os.ReadFile(rc.CAFile); err != nil {
			t.Fatal(err)
		}
	}
	saConfig := filepath.Join(t.TempDir(), "agent-kubeconfig")
	if err := clientcmd.WriteToFile(clientcmdapi.Config{
		Clusters:       map[string]*clientcmdapi.Cluster{"c": {Server: rc.Host, CertificateAuthorityData: ca}},
		AuthInfos:      map[string]*clientcmdapi.AuthInfo{"sa": {Token: tok.Status.Token}},
		Contexts:       map[string]*clientcmdapi.Context{"c": {Cluster: "c", AuthInfo: "sa"}},
		CurrentContext: "c",
	}, saConfig); err != nil {
		t.Fatal(err)
	}
	saRest, err := clientcmd.BuildConfigFromFlags("", saConfig)
	if err != nil {
		t.Fatal(err)
	}
	asAgent, err := kubernetes.NewForConfig(saRest)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := asAgent.CoreV1().Secrets(caNamespace).Get(ctx, enroll.ClusterJoinSecret, metav1.GetOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the agent's token reads its join Secret: %v, want Forbidden", err)
	}

	// Stand-in kubelets run the agent's pod (the Deployment is pointed at
	// kwok-gpu-0) and its workers' (its agent puts them on kwok-cpu-0 with
	// --worker-node-selector and --worker-pod-annotation).
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		dep, err := kube.AppsV1().Deployments(caNamespace).Get(ctx, enroll.ClusterAgentName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		tpl := &dep.Spec.Template
		tpl.Annotations = map[string]string{standinAnnotation: "standin"}
		tpl.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": kubecluster.GPUNode}
		tpl.Spec.Containers[0].Args = append(tpl.Spec.Containers[0].Args, "--worker-node-selector", "kubernetes.io/hostname="+kubecluster.CPUNode,
			"--worker-pod-annotation", standinAnnotation+"=standin")
		_, err = kube.AppsV1().Deployments(caNamespace).Update(ctx, dep, metav1.UpdateOptions{})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	// The agent's pod runs in the host's network (it reaches the API
	// server on 127.0.0.1) on kwok-gpu-0; its workers run containers, in
	// the test's network namespace, on kwok-cpu-0.
	startStandin(t, kube, caNamespace, kubecluster.GPUNode, "", []string{"KUBECONFIG=" + saConfig}, nil)
	kl := startStandin(t, kube, caNamespace, kubecluster.CPUNode, w.box.ns, nil, nil)

	controlplanetest.Eventually(t, 120*time.Second, "the cluster agent online with its nodes", func() bool {
		out, _, err := w.cli(t, "cluster", "show", agentID)
		return err == nil && strings.Contains(out, "online") && strings.Contains(out, "Largest node:")
	})
	show, _, _ := w.cli(t, "cluster", "show", agentID)
	t.Logf("cluster show:\n%s", show)
	for _, want := range []string{"CPUs:", "64", "GPUs:", "4", "Nodes:", "2", "Largest node:", kubecluster.GPUNode + ": 32 CPUs, 256.0 GiB, 4 GPUs"} {
		if !strings.Contains(show, want) {
			t.Errorf("cluster show lacks %q", want)
		}
	}
	if ms := w.machines(t); len(ms) != 1 || ms[0].ID != agentID {
		t.Errorf("machines before any task: %+v, want the agent only", ms)
	}

	t.Run("a task bigger than any node is refused", func(t *testing.T) {
		_, errOut, err := w.cli(t, "run", "--pool", "attached", "--cpu", "40", "--", "true")
		if err == nil || !strings.Contains(errOut, "bigger than any node") || !strings.Contains(errOut, kubecluster.GPUNode) {
			t.Errorf("a 40-CPU task: err %v\n%s", err, errOut)
		}
	})

	t.Run("a task runs on a worker Job the agent made", func(t *testing.T) {
		r := w.start(t, "run", "--pool", "attached", "--cpu", "0.5", "--memory", "256Mi", "--", "sh", "-c", "echo hello from an attached cluster")
		if code := r.wait(t, 120*time.Second); code != 0 {
			so, se := r.out()
			t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, so, se)
		}
		if so, _ := r.out(); !strings.Contains(so, "hello from an attached cluster") {
			t.Errorf("stdout = %q", so)
		}
		jobs, err := kube.BatchV1().Jobs(caNamespace).List(ctx, metav1.ListOptions{LabelSelector: kubeworkers.LabelPool + "=attached"})
		if err != nil || len(jobs.Items) != 1 {
			t.Fatalf("worker Jobs in %s: %v %d, want 1", caNamespace, err, len(jobs.Items))
		}
		j := jobs.Items[0]
		managers := []string{}
		for _, f := range j.ManagedFields {
			managers = append(managers, f.Manager)
		}
		if !strings.Contains(strings.Join(managers, ","), "levers9-agent") {
			t.Errorf("the Job's managers are %v, want the cluster agent (levers9-agent)", managers)
		}
		if q := j.Spec.Template.Spec.Containers[0].Resources.Requests[corev1.ResourceCPU]; q.MilliValue() != 500 {
			t.Errorf("cpu request %s, want the task's 500m", q.String())
		}
		ts := w.tasks(t)
		applied := appliedOf(t, w.joinWorld, ts[0].ID)
		if len(applied) != 1 || applied[0] == nil || !applied[0].NetRawDropped || applied[0].SeccompMode != "enforce" {
			t.Errorf("applied security = %+v, want the worker-wide values (NET_RAW dropped, seccomp enforce), not the pool's", applied)
		}
	})

	t.Run("a deleted worker pod retries the task on a new worker", func(t *testing.T) {
		r := w.start(t, "run", "--pool", "attached", "--retries", "2", "--", "sh", "-c", "echo begin; sleep 6; echo end; exit 3")
		controlplanetest.Eventually(t, 90*time.Second, "the task's first line", func() bool { so, _ := r.out(); return strings.Contains(so, "begin") })
		pods, err := kube.CoreV1().Pods(caNamespace).List(ctx, metav1.ListOptions{LabelSelector: kubeworkers.LabelApp + "=" + kubeworkers.AppName})
		if err != nil {
			t.Fatal(err)
		}
		var victim string
		for _, p := range pods.Items {
			if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
				victim = p.Name
			}
		}
		if victim == "" {
			t.Fatal("no running worker pod")
		}
		before := len(kl.startedPods())
		deleted := time.Now()
		if err := kube.CoreV1().Pods(caNamespace).Delete(ctx, victim, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		controlplanetest.Eventually(t, 30*time.Second, "the attempt marker", func() bool { _, se := r.out(); return strings.Contains(se, "--- attempt 2") })
		lost := time.Since(deleted)
		t.Logf("attempt 2 announced %s after the worker pod's deletion", lost.Round(time.Millisecond))
		if lost > 20*time.Second {
			t.Errorf("attempt lost %s after the pod's deletion (lostAgentGrace is 2m: it must come from the agent's pod watch)", lost)
		}
		code := r.wait(t, 120*time.Second)
		so, se := r.out()
		if code != 3 || strings.Count(so, "begin") != 2 || strings.Count(so, "end") != 1 {
			t.Errorf("exit %d\nstdout:\n%s\nstderr:\n%s", code, so, se)
		}
		if !strings.Contains(se, "lost") || !strings.Contains(se, victim) {
			t.Errorf("the marker does not say the attempt was lost with pod %s:\n%s", victim, se)
		}
		if n := len(kl.startedPods()) - before; n != 1 {
			t.Errorf("%d pods started for the retry, want 1", n)
		}
	})

	t.Run("the agent's ServiceAccount may do only its job", func(t *testing.T) {
		for _, tc := range []struct {
			verb, group, resource, ns string
			want                      bool
		}{
			{"create", "batch", "jobs", caNamespace, true},
			{"delete", "batch", "jobs", caNamespace, true},
			{"create", "", "secrets", caNamespace, true},
			{"list", "", "nodes", "", true},
			{"get", "", "secrets", caNamespace, false},
			{"list", "", "secrets", caNamespace, false},
			{"create", "batch", "jobs", "default", false},
			{"list", "", "pods", "kube-system", false},
			{"create", "", "pods", caNamespace, false},
			{"update", "", "nodes", "", false},
		} {
			if got := kubetest.ServiceAccountCan(t, kube, caNamespace, enroll.ClusterAgentName, authorizationv1.ResourceAttributes{Verb: tc.verb,
				Group: tc.group, Resource: tc.resource, Namespace: tc.ns}); got != tc.want {
				t.Errorf("the agent may %s %s in %q: %v, want %v", tc.verb, tc.resource, tc.ns, got, tc.want)
			}
		}
		if k := w.in.Config.Worker.Kubernetes.Kubeconfig; k != "" {
			t.Errorf("the controlplane has a kubeconfig: %s", k)
		}
		for name, p := range w.in.Config.Worker.Pools {
			if p.Kubeconfig != "" || p.IsKubernetes() {
				t.Errorf("pool %s gives the controlplane a cluster (provider %q, kubeconfig %q)", name, p.Provider, p.Kubeconfig)
			}
		}
	})

	t.Run("cluster delete removes the Jobs, then the agent", func(t *testing.T) {
		jobs, err := kube.BatchV1().Jobs(caNamespace).List(ctx, metav1.ListOptions{LabelSelector: kubeworkers.LabelApp + "=" + kubeworkers.AppName})
		if err != nil || len(jobs.Items) == 0 {
			t.Fatalf("no worker Job to remove: %v", err)
		}
		out, errOut, err := w.cli(t, "cluster", "delete", agentID)
		if err != nil || !strings.Contains(out, "removed") {
			t.Fatalf("cluster delete: %v\n%s%s", err, out, errOut)
		}
		t.Logf("cluster delete: %s", out)
		controlplanetest.Eventually(t, 30*time.Second, "the worker Jobs gone", func() bool {
			l, err := kube.BatchV1().Jobs(caNamespace).List(ctx, metav1.ListOptions{LabelSelector: kubeworkers.LabelApp + "=" + kubeworkers.AppName})
			if err != nil {
				return false
			}
			for _, j := range l.Items {
				if j.DeletionTimestamp == nil {
					return false
				}
			}
			return true
		})
		for _, ms := range w.machines(t) {
			if ms.State == "MACHINE_STATE_ONLINE" {
				t.Errorf("machine %s still online after cluster delete", ms.ID)
			}
		}
	})
}
