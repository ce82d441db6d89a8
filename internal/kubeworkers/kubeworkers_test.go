package kubeworkers_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/levers9/levers9/internal/kubecluster"
	"github.com/levers9/levers9/internal/kubecluster/kubetest"
	"github.com/levers9/levers9/internal/kubeworkers"
	"github.com/levers9/levers9/internal/testenv"
)

const ns = "l9kw-workers"

func setup(t *testing.T) (kubernetes.Interface, *kubeworkers.Client) {
	t.Helper()
	c := kubetest.Start(t)
	kube := c.Clientset()
	ctx := context.Background()
	if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := kube.NodeV1().RuntimeClasses().Create(ctx, &nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: "gvisor"}, Handler: "runsc"}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return kube, kubeworkers.New(kube, ns)
}

func workerOf(t *testing.T, c *kubeworkers.Client, machine string) kubeworkers.Worker {
	t.Helper()
	ws, err := c.List(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range ws {
		if w.MachineID == machine {
			return w
		}
	}
	return kubeworkers.Worker{}
}

// TestWorkerJobs runs against the real API server, controller manager,
// scheduler and kwok: a GPU worker Job gets its pod bound to the GPU node
// with the requests, selector, tolerations, RuntimeClass and privileged
// container the chart documents, and its join Secret owned by it; a Job no
// node can take is "waiting for nodes"; a deleted pod is reported once;
// Delete removes the Job, its pod and its Secret.
func TestWorkerJobs(t *testing.T) {
	kube, c := setup(t)
	ctx := context.Background()
	var mu sync.Mutex
	var gone []kubeworkers.PodGone
	w := c.Watch("", func(g kubeworkers.PodGone) { mu.Lock(); gone = append(gone, g); mu.Unlock() })
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)

	gpu := kubeworkers.Spec{Pool: "gpu", MachineID: "m_abcdefgh23456789", Image: "registry.example/levers9-worker:v1", Controlplane: "cp.example:1993",
		CPUMillis: 2500, MemoryBytes: 4 << 30, GPUs: 2, Enforced: true, NodeSelector: map[string]string{kubecluster.GPULabel: "true"},
		Tolerations:      []corev1.Toleration{{Key: "nvidia.com/gpu", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
		RuntimeClassName: "gvisor", IdleTimeout: 30 * time.Second, PodAnnotations: map[string]string{"levers9.dev/kubelet": "test"},
		AgentArgs: []string{"--insecure-registries", "127.0.0.1:5000"}, ImagePullSecrets: []string{"regcred"}}
	job, err := c.Create(ctx, gpu, "l9jt_secret-token", []byte("-----BEGIN CERTIFICATE-----\n"))
	if err != nil {
		t.Fatal(err)
	}
	if job.Name != "levers9-worker-gpu-abcdefgh23456789" {
		t.Errorf("job name = %q", job.Name)
	}
	var pod corev1.Pod
	testenv.Eventually(t, 60*time.Second, "the worker pod bound to "+kubecluster.GPUNode, func() bool {
		pods, err := kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: kubeworkers.LabelMachine + "=" + gpu.MachineID})
		if err != nil || len(pods.Items) != 1 || pods.Items[0].Spec.NodeName == "" {
			return false
		}
		pod = pods.Items[0]
		return true
	})
	if pod.Spec.NodeName != kubecluster.GPUNode {
		t.Errorf("pod bound to %s", pod.Spec.NodeName)
	}
	ctr := pod.Spec.Containers[0]
	if q := ctr.Resources.Requests[kubeworkers.GPUResource]; q.Value() != 2 {
		t.Errorf("gpu request = %v", ctr.Resources.Requests)
	}
	if q := ctr.Resources.Requests[corev1.ResourceCPU]; q.MilliValue() != 2500 {
		t.Errorf("cpu request = %v", q.String())
	}
	if q := ctr.Resources.Limits[corev1.ResourceMemory]; q.Value() != 4<<30 {
		t.Errorf("memory limit = %v", q.String())
	}
	if ctr.SecurityContext == nil || ctr.SecurityContext.Privileged == nil || !*ctr.SecurityContext.Privileged {
		t.Error("worker container is not privileged")
	}
	if len(pod.Spec.ImagePullSecrets) != 1 || pod.Spec.ImagePullSecrets[0].Name != "regcred" {
		t.Errorf("pod imagePullSecrets = %v, want regcred", pod.Spec.ImagePullSecrets)
	}
	if pod.Spec.RuntimeClassName == nil || *pod.Spec.RuntimeClassName != "gvisor" || len(pod.Spec.Tolerations) == 0 ||
		pod.Spec.NodeSelector[kubecluster.GPULabel] != "true" || *pod.Spec.AutomountServiceAccountToken {
		t.Errorf("pod spec = runtimeClass %v tolerations %v selector %v", pod.Spec.RuntimeClassName, pod.Spec.Tolerations, pod.Spec.NodeSelector)
	}
	env := map[string]string{}
	for _, e := range ctr.Env {
		env[e.Name] = e.Value
	}
	if env[kubeworkers.EnvCP] != "cp.example:1993" || env[kubeworkers.EnvIdle] != "30s" {
		t.Errorf("env = %v", env)
	}
	cmd := strings.Join(append(ctr.Command, ctr.Args...), " ")
	for _, want := range []string{"/etc/levers9/join/token", "levers9-agent join", "exec levers9-agent run", "--exit-when-idle", "--insecure-registries 127.0.0.1:5000"} {
		if !strings.Contains(cmd, want) {
			t.Errorf("command %q lacks %q", cmd, want)
		}
	}
	if strings.Contains(cmd, "secret-token") {
		t.Error("the join token is in the command line")
	}
	sec, err := kube.CoreV1().Secrets(ns).Get(ctx, job.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if string(sec.Data[kubeworkers.TokenKey]) != "l9jt_secret-token" || len(sec.OwnerReferences) != 1 || sec.OwnerReferences[0].UID != job.UID {
		t.Errorf("secret = %v owners %v", sec.Data, sec.OwnerReferences)
	}
	if st := workerOf(t, c, gpu.MachineID); st.State != kubeworkers.Starting || st.GPUs != 2 || st.CPUMillis != 2500 {
		t.Errorf("worker = %+v, want starting with its size", st)
	}

	// Five GPUs: no node has them, the pod stays Pending.
	big := gpu
	big.MachineID, big.GPUs = "m_bigbigbig2345678", 5
	if _, err := c.Create(ctx, big, "l9jt_other", nil); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 60*time.Second, "waiting for nodes", func() bool { return workerOf(t, c, big.MachineID).State == kubeworkers.WaitingForNodes })

	// A reclaimed node: the pod is deleted under the worker.
	if err := kube.CoreV1().Pods(ns).Delete(ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 60*time.Second, "the deleted pod reported", func() bool { mu.Lock(); defer mu.Unlock(); return len(gone) > 0 })
	time.Sleep(time.Second) // a second report would come within this
	mu.Lock()
	if len(gone) != 1 || gone[0].MachineID != gpu.MachineID || gone[0].Pool != "gpu" || !strings.Contains(gone[0].Why, pod.Name) {
		t.Errorf("reports = %+v", gone)
	}
	mu.Unlock()

	for _, m := range []string{gpu.MachineID, big.MachineID} {
		if err := c.Delete(ctx, kubeworkers.JobName("gpu", m)); err != nil {
			t.Fatal(err)
		}
		if err := c.Delete(ctx, kubeworkers.JobName("gpu", m)); err != nil {
			t.Fatalf("second Delete: %v", err)
		}
	}
	testenv.Eventually(t, 60*time.Second, "Jobs, pods and Secrets gone", func() bool {
		ws, _ := c.List(ctx, "")
		pods, _ := kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		_, err := kube.CoreV1().Secrets(ns).Get(ctx, job.Name, metav1.GetOptions{})
		return len(ws) == 0 && len(pods.Items) == 0 && apierrors.IsNotFound(err)
	})

	// Start/Stop: repeatedly, twice, and Stop before Start.
	c.Watch("", func(kubeworkers.PodGone) {}).Stop()
	for i := 0; i < 5; i++ {
		wt := c.Watch("", func(kubeworkers.PodGone) {})
		if err := wt.Start(ctx); err != nil {
			t.Fatal(err)
		}
		if err := wt.Start(ctx); err == nil {
			t.Error("a second Start succeeded")
		}
		wt.Stop()
		wt.Stop()
	}
}
