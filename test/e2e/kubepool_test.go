package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/levers9/levers9/controlplane/config"
	"github.com/levers9/levers9/controlplane/controlplanetest"
	"github.com/levers9/levers9/internal/kubecluster"
	"github.com/levers9/levers9/internal/kubecluster/kubetest"
	"github.com/levers9/levers9/internal/kubeworkers"
)

const kpNamespace = "l9kp-workers"

// jobRecorder keeps every worker Job it has seen, by pool, and the most
// that existed at once.
type jobRecorder struct {
	mu   sync.Mutex
	seen map[string]map[string]batchv1.Job
	most map[string]int
}

func recordJobs(t *testing.T, kube kubernetes.Interface) *jobRecorder {
	r := &jobRecorder{seen: map[string]map[string]batchv1.Job{}, most: map[string]int{}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			if l, err := kube.BatchV1().Jobs(kpNamespace).List(ctx, metav1.ListOptions{}); err == nil {
				now := map[string]int{}
				r.mu.Lock()
				for _, j := range l.Items {
					pool := j.Labels[kubeworkers.LabelPool]
					if r.seen[pool] == nil {
						r.seen[pool] = map[string]batchv1.Job{}
					}
					r.seen[pool][j.Name] = j
					now[pool]++
				}
				for p, n := range now {
					r.most[p] = max(r.most[p], n)
				}
				r.mu.Unlock()
			}
			select {
			case <-ctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return r
}

func (r *jobRecorder) jobs(pool string) []batchv1.Job {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []batchv1.Job
	for _, j := range r.seen[pool] {
		out = append(out, j)
	}
	return out
}

func (r *jobRecorder) peak(pool string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.most[pool]
}

type listedPool struct {
	Name       string `json:"name"`
	Provider   string `json:"provider"`
	Status     string `json:"status"`
	Workers    int    `json:"workers"`
	MaxWorkers int    `json:"maxWorkers"`
}

func (w *taskWorld) pool(t *testing.T, name string) listedPool {
	t.Helper()
	var resp struct {
		Pools []listedPool `json:"pools"`
	}
	w.cliJSON(t, &resp, "pool", "list")
	for _, p := range resp.Pools {
		if p.Name == name {
			return p
		}
	}
	t.Fatalf("pool %s not listed", name)
	return listedPool{}
}

// TestKubernetesPools runs pools with provider kubernetes against the real
// API server, controller manager, scheduler and kwok, with a stand-in
// kubelet running the worker pods bound to kwok-cpu-0 as real agents (in a
// network namespace, with runc):
//
//   - a task on a runc pool makes exactly one worker Job with the pool's
//     selector, RuntimeClass and a privileged container; the worker joins
//     with the Job's single-use token, the task runs, its output reaches
//     `levers9 run` and `task show` reports the pool's security applied;
//   - the worker pod deleted mid-task (a reclaimed node) loses the attempt
//     at once (well within lostAgentGrace), a new Job's worker runs it
//     again, never more than maxWorkers Jobs at once, and the follower
//     shows the attempt marker and exits with the task's code;
//   - a GPU task on a GPU pool makes one Job requesting the CPU, memory and
//     nvidia.com/gpu of the task, with tolerations, bound to kwok-gpu-0,
//     whose stand-in gives the agent a fake NVML library and driver files:
//     the task runs with the two GPUs it was given;
//   - a pool whose pods fit no node says "waiting for nodes" and creates
//     nothing twice; its tasks cancelled, the Job goes;
//   - idle workers exit, and their Jobs and Secrets are removed.
func TestKubernetesPools(t *testing.T) {
	kc := kubetest.Start(t)
	kube := kc.Clientset()
	ctx := context.Background()
	if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: kpNamespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := kube.NodeV1().RuntimeClasses().Create(ctx, &nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: "l9kp-runc"}, Handler: "runc"}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	jobs := recordJobs(t, kube)
	standin := map[string]string{standinAnnotation: "standin"}
	w := &taskWorld{runs: map[string]machineRun{}}
	w.joinWorld = setupJoinWorldWith(t, func(c *config.Config) {
		// Long: a lost attempt must come from the pod watch, not the grace.
		c.Controlplane.LostAgentGrace = "2m"
		w.demoImage(t, c)
		c.Worker.Kubernetes = config.KubeWorkers{Namespace: kpNamespace, Kubeconfig: kc.KubeconfigPath(), Image: "registry.example/levers9-worker:e2e",
			AgentArgs: []string{"--insecure-registries", w.registry}}
		c.Worker.Pools["kcpu"] = config.Pool{Runtime: "runc", Provider: config.ProviderKubernetes, IdleTimeout: "6s", MaxWorkers: 1, Shape: config.WorkerShape{CPU: "2", Memory: "2Gi"},
			NodeSelector: map[string]string{"kubernetes.io/hostname": kubecluster.CPUNode}, RuntimeClassName: "l9kp-runc",
			PodAnnotations: standin}
		c.Worker.Pools["kgpu"] = config.Pool{Runtime: "runc", Provider: config.ProviderKubernetes, IdleTimeout: "6s", MaxWorkers: 2, Shape: config.WorkerShape{CPU: "8", Memory: "16Gi", GPUs: 4},
			NodeSelector: map[string]string{kubecluster.GPULabel: "true"}, RuntimeClassName: "l9kp-runc",
			Tolerations: []config.Toleration{{Key: "nvidia.com/gpu", Operator: "Exists", Effect: "NoSchedule"}}, PodAnnotations: standin}
		c.Worker.Pools["knowhere"] = config.Pool{Runtime: "runc", Provider: config.ProviderKubernetes, IdleTimeout: "6s", MaxWorkers: 3, Shape: config.WorkerShape{CPU: "1", Memory: "1Gi"},
			NodeSelector: map[string]string{"levers9.dev/zone": "nowhere"}, PodAnnotations: standin}
	})
	kl := startStandin(t, kube, kpNamespace, kubecluster.CPUNode, w.box.ns, nil, nil)
	// kwok-gpu-0's worker pods see its four GPUs through a fake NVML
	// library and fake driver files.
	libDir, gpuRoot := fakeGPUNode(t, kubecluster.GPUsPerNode)
	startStandin(t, kube, kpNamespace, kubecluster.GPUNode, w.box.ns, []string{"LD_LIBRARY_PATH=" + libDir}, []string{"--gpu-root", gpuRoot})

	t.Run("a task makes one worker Job and runs on it", func(t *testing.T) {
		r := w.start(t, "run", "--pool", "kcpu", "--cpu", "0.5", "--memory", "256Mi", "--", "sh", "-c", "echo hello from a worker pod")
		if code := r.wait(t, 120*time.Second); code != 0 {
			so, se := r.out()
			t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, so, se)
		}
		if so, _ := r.out(); !strings.Contains(so, "hello from a worker pod") {
			t.Errorf("stdout = %q", so)
		}
		js := jobs.jobs("kcpu")
		if len(js) != 1 {
			t.Fatalf("%d Jobs for pool kcpu, want 1", len(js))
		}
		spec := js[0].Spec.Template.Spec
		ctr := spec.Containers[0]
		if spec.NodeSelector["kubernetes.io/hostname"] != kubecluster.CPUNode || spec.RuntimeClassName == nil || *spec.RuntimeClassName != "l9kp-runc" ||
			ctr.SecurityContext == nil || !*ctr.SecurityContext.Privileged || ctr.Image != "registry.example/levers9-worker:e2e" {
			t.Errorf("worker pod spec: selector %v runtimeClass %v security %v image %s", spec.NodeSelector, spec.RuntimeClassName, ctr.SecurityContext, ctr.Image)
		}
		if q := ctr.Resources.Requests[corev1.ResourceCPU]; q.MilliValue() != 500 {
			t.Errorf("cpu request %s, want 500m (the waiting task's)", q.String())
		}
		ts := w.tasks(t)
		applied := appliedOf(t, w.joinWorld, ts[0].ID)
		if len(applied) != 1 || applied[0] == nil || applied[0].Runtime != "runc" || applied[0].SeccompMode != "enforce" ||
			!applied[0].NetRawDropped || !applied[0].NoNewPrivileges || applied[0].Profile != "hardened" {
			raw, _ := json.Marshal(applied)
			t.Errorf("applied security = %s", raw)
		}
	})

	t.Run("a deleted worker pod retries the task on a new worker", func(t *testing.T) {
		r := w.start(t, "run", "--pool", "kcpu", "--retries", "2", "--", "sh", "-c", "echo begin; sleep 6; echo end; exit 3")
		controlplanetest.Eventually(t, 90*time.Second, "the task's first line", func() bool { so, _ := r.out(); return strings.Contains(so, "begin") })
		before := len(kl.startedPods())
		pods, err := kube.CoreV1().Pods(kpNamespace).List(ctx, metav1.ListOptions{LabelSelector: kubeworkers.LabelPool + "=kcpu"})
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
		deleted := time.Now()
		if err := kube.CoreV1().Pods(kpNamespace).Delete(ctx, victim, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		controlplanetest.Eventually(t, 30*time.Second, "the attempt marker", func() bool { _, se := r.out(); return strings.Contains(se, "--- attempt 2") })
		lost := time.Since(deleted)
		t.Logf("attempt 2 announced %s after the worker pod's deletion", lost.Round(time.Millisecond))
		if lost > 20*time.Second {
			t.Errorf("attempt lost %s after the pod's deletion (lostAgentGrace is 2m: it must come from the pod watch)", lost)
		}
		code := r.wait(t, 120*time.Second)
		so, se := r.out()
		if code != 3 || strings.Count(so, "begin") != 2 || strings.Count(so, "end") != 1 {
			t.Errorf("exit %d\nstdout:\n%s\nstderr:\n%s", code, so, se)
		}
		if !strings.Contains(se, "lost") || !strings.Contains(se, victim) {
			t.Errorf("the marker does not say the attempt was lost with pod %s:\n%s", victim, se)
		}
		if n := len(kl.startedPods()); n != before+1 {
			t.Errorf("%d worker pods started for the retry, want 1", n-before)
		}
		if p := jobs.peak("kcpu"); p > 1 {
			t.Errorf("%d Jobs at once in pool kcpu, maxWorkers is 1", p)
		}
	})

	t.Run("a GPU task makes one Job sized for it and runs on its GPUs", func(t *testing.T) {
		r := w.start(t, "run", "--pool", "kgpu", "--gpu", "2", "--cpu", "1", "--memory", "512Mi", "--", "sh", "-c", "ls /dev | grep nvidia")
		if code := r.wait(t, 120*time.Second); code != 0 {
			so, se := r.out()
			t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, so, se)
		}
		so, _ := r.out()
		t.Logf("the GPU task's devices: %q", so)
		if !strings.Contains(so, "nvidia0") || !strings.Contains(so, "nvidia1") || strings.Contains(so, "nvidia2") {
			t.Errorf("the task's devices, want nvidia0 and nvidia1 only:\n%s", so)
		}
		js := jobs.jobs("kgpu")
		if len(js) != 1 {
			t.Fatalf("%d Jobs for the GPU task, want 1", len(js))
		}
		spec := js[0].Spec.Template.Spec
		ctr := spec.Containers[0]
		req := ctr.Resources.Requests
		if g, c, m := req[kubeworkers.GPUResource], req[corev1.ResourceCPU], req[corev1.ResourceMemory]; g.Value() != 2 || c.MilliValue() != 1000 || m.Value() != 512<<20 {
			t.Errorf("worker pod requests %v, want the task's 1 CPU, 512Mi and 2 nvidia.com/gpu", req)
		}
		if lim := ctr.Resources.Limits[kubeworkers.GPUResource]; lim.Value() != 2 {
			t.Errorf("worker pod GPU limit %v", ctr.Resources.Limits)
		}
		if len(spec.Tolerations) == 0 || spec.NodeSelector[kubecluster.GPULabel] != "true" || spec.RuntimeClassName == nil || *spec.RuntimeClassName != "l9kp-runc" ||
			!*ctr.SecurityContext.Privileged {
			t.Errorf("pod spec: tolerations %v selector %v runtimeClass %v", spec.Tolerations, spec.NodeSelector, spec.RuntimeClassName)
		}
		pods, err := kube.CoreV1().Pods(kpNamespace).List(ctx, metav1.ListOptions{LabelSelector: kubeworkers.LabelPool + "=kgpu"})
		if err != nil || len(pods.Items) != 1 || pods.Items[0].Spec.NodeName != kubecluster.GPUNode {
			t.Errorf("GPU worker pods: %v %v", err, pods)
		}
		ts := w.tasks(t)
		applied := appliedOf(t, w.joinWorld, ts[0].ID)
		if len(applied) != 1 || applied[0] == nil || applied[0].Runtime != "runc" || applied[0].SeccompMode != "enforce" || !applied[0].NetRawDropped {
			raw, _ := json.Marshal(applied)
			t.Errorf("applied security = %s", raw)
		}
	})

	t.Run("pods no node takes: waiting for nodes, nothing made twice", func(t *testing.T) {
		r := w.start(t, "run", "--pool", "knowhere", "--cpu", "0.5", "--detach", "--", "true")
		r2 := w.start(t, "run", "--pool", "knowhere", "--cpu", "0.5", "--detach", "--", "true")
		_, _ = r.wait(t, 30*time.Second), r2.wait(t, 30*time.Second)
		controlplanetest.Eventually(t, 60*time.Second, "pool list: waiting for nodes", func() bool {
			return w.pool(t, "knowhere").Status == "waiting for nodes"
		})
		// Workers are sized for the work waiting when they are made: two
		// submits in one reconcile tick share one Job of 1 CPU, in two
		// ticks they get a Job of 0.5 CPU each. Either way the Jobs ask for
		// exactly the work, and further ticks add nothing while the pods
		// wait for a node.
		requested := func() (n int, millis int64) {
			for _, j := range jobs.jobs("knowhere") {
				cpu, _ := strconv.ParseInt(j.Annotations[kubeworkers.AnnotCPU], 10, 64)
				n, millis = n+1, millis+cpu
			}
			return n, millis
		}
		n, millis := requested()
		time.Sleep(3 * time.Second)
		if n2, millis2 := requested(); n == 0 || millis != 1000 || n2 != n || millis2 != millis {
			t.Errorf("Jobs for two 0.5-CPU tasks: %d asking %dm CPU, then %d asking %dm; want one or two asking 1000m in all, and no more later", n, millis, n2, millis2)
		}
		out, _, _ := w.cli(t, "pool", "list")
		if !strings.Contains(out, fmt.Sprintf("%d/3 (waiting for nodes)", n)) {
			t.Errorf("pool list (want %d/3 waiting for nodes):\n%s", n, out)
		}
		// Cancelled, the work needs no worker: the Job goes before a node
		// ever takes it.
		for _, task := range w.tasks(t) {
			if task.State == "TASK_STATE_PENDING" {
				if _, errOut, err := w.cli(t, "task", "cancel", task.ID); err != nil {
					t.Fatalf("cancel: %v %s", err, errOut)
				}
			}
		}
		controlplanetest.Eventually(t, 30*time.Second, "the unneeded Job removed", func() bool {
			l, err := kube.BatchV1().Jobs(kpNamespace).List(ctx, metav1.ListOptions{LabelSelector: kubeworkers.LabelPool + "=knowhere"})
			return err == nil && len(l.Items) == 0
		})
	})

	t.Run("idle workers exit and their Jobs and Secrets go", func(t *testing.T) {
		controlplanetest.Eventually(t, 60*time.Second, "the kcpu Jobs and Secrets removed", func() bool {
			js, err := kube.BatchV1().Jobs(kpNamespace).List(ctx, metav1.ListOptions{LabelSelector: kubeworkers.LabelPool + "=kcpu"})
			if err != nil || len(js.Items) > 0 {
				return false
			}
			for _, j := range jobs.jobs("kcpu") {
				if _, err := kube.CoreV1().Secrets(kpNamespace).Get(ctx, j.Name, metav1.GetOptions{}); err == nil {
					return false
				}
			}
			return true
		})
		exits := kl.exits()
		if len(exits) == 0 || !strings.HasSuffix(exits[len(exits)-1], "exit 0") {
			t.Errorf("worker exits = %v, want the last to exit 0 (idle)", exits)
		}
		var resp struct {
			Machines []listedMachine `json:"machines"`
		}
		w.cliJSON(t, &resp, "machine", "list", "--pool", "kcpu")
		for _, m := range resp.Machines {
			if m.State == "MACHINE_STATE_ONLINE" {
				t.Errorf("machine %s of a removed worker still online", m.ID)
			}
		}
	})
}
