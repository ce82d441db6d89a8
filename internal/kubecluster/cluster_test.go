package kubecluster_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/levers9/levers9/internal/kubecluster"
	"github.com/levers9/levers9/internal/kubecluster/kubetest"
	"github.com/levers9/levers9/internal/procstat"
	"github.com/levers9/levers9/internal/testenv"
)

func TestCluster(t *testing.T) {
	start := time.Now()
	c := kubetest.Start(t)
	t.Logf("control plane up with Ready nodes in %v", time.Since(start).Round(time.Millisecond))
	logRSS(t, c)

	st, err := os.Stat(c.KubeconfigPath())
	if err != nil {
		t.Fatalf("stat kubeconfig: %v", err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("kubeconfig mode = %v, want 0600 (it holds the admin key)", st.Mode().Perm())
	}

	t.Run("version", func(t *testing.T) {
		v, err := c.Clientset().Discovery().ServerVersion()
		if err != nil {
			t.Fatalf("server version: %v", err)
		}
		if v.GitVersion != "v1.36.3" {
			t.Errorf("server version = %q, want v1.36.3", v.GitVersion)
		}
	})
	t.Run("rbac", func(t *testing.T) { testRBAC(t, c) })
	t.Run("gpu-job", func(t *testing.T) { testGPUJob(t, c) })
	t.Run("too-many-gpus", func(t *testing.T) { testTooManyGPUs(t, c) })
}

// logRSS logs each component's resident memory.
func logRSS(t *testing.T, c *kubecluster.Cluster) {
	t.Helper()
	rss := map[string]int64{}
	var names []string
	var total int64
	for name, pid := range c.PIDs() {
		n, err := residentBytes(pid)
		if err != nil {
			t.Fatalf("measuring the memory of %s: %v", name, err)
		}
		rss[name] = n
		names = append(names, name)
		total += n
	}
	sort.Strings(names)
	var b strings.Builder
	for _, name := range names {
		fmt.Fprintf(&b, " %s=%dMB", name, rss[name]>>20)
	}
	t.Logf("RSS total=%dMB:%s", total>>20, b.String())
}

// residentBytes is the resident set size of pid (VmRSS in /proc/PID/status).
func residentBytes(pid int) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("parsing VmRSS of pid %d: %w", pid, err)
			}
			return kb * 1024, nil
		}
	}
	return 0, fmt.Errorf("no VmRSS for pid %d", pid)
}

func testRBAC(t *testing.T, c *kubecluster.Cluster) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	saGroups := []string{"system:serviceaccounts", "system:serviceaccounts:default", "system:authenticated"}
	tests := []struct {
		name    string
		user    string
		groups  []string
		verb    string
		res     string
		ns      string
		allowed bool
	}{
		{"service account reads kube-system secrets", "system:serviceaccount:default:default", saGroups, "get", "secrets", "kube-system", false},
		{"service account lists nodes", "system:serviceaccount:default:default", saGroups, "list", "nodes", "", false},
		{"system:masters reads kube-system secrets", "someone", []string{"system:masters", "system:authenticated"}, "get", "secrets", "kube-system", true},
		{"scheduler lists pods (bootstrap role)", "system:kube-scheduler", []string{"system:authenticated"}, "list", "pods", "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sar := &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{
				User: tt.user, Groups: tt.groups,
				ResourceAttributes: &authzv1.ResourceAttributes{Verb: tt.verb, Resource: tt.res, Namespace: tt.ns},
			}}
			got, err := c.Clientset().AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
			if err != nil {
				t.Fatalf("SubjectAccessReview: %v", err)
			}
			if got.Status.Allowed != tt.allowed {
				t.Errorf("allowed = %v (%s), want %v", got.Status.Allowed, got.Status.Reason, tt.allowed)
			}
		})
	}

	// The same with a real token: authentication and authorisation together.
	t.Run("service account token is forbidden", func(t *testing.T) {
		tok, err := c.Clientset().CoreV1().ServiceAccounts("default").CreateToken(ctx, "default",
			&authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("token request: %v", err)
		}
		cfg := c.RESTConfig()
		cfg.TLSClientConfig = rest.TLSClientConfig{CAFile: cfg.CAFile}
		cfg.BearerToken = tok.Status.Token
		sa, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			t.Fatalf("service account client: %v", err)
		}
		_, err = sa.CoreV1().Secrets("kube-system").List(ctx, metav1.ListOptions{})
		if !apierrors.IsForbidden(err) {
			t.Errorf("listing kube-system secrets as default:default: err = %v, want Forbidden", err)
		}
		if _, err := sa.Discovery().ServerVersion(); err != nil {
			t.Errorf("the token does not authenticate: %v", err)
		}
	})
}

func testGPUJob(t *testing.T, c *kubecluster.Cluster) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cs := c.Clientset()
	pods, err := cs.CoreV1().Pods("default").Watch(ctx, metav1.ListOptions{LabelSelector: "batch.kubernetes.io/job-name=gpu-job"})
	if err != nil {
		t.Fatalf("watching pods: %v", err)
	}
	defer pods.Stop()

	created := time.Now()
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: "gpu-job"},
		Spec: batchv1.JobSpec{
			BackoffLimit: new(int32),
			Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
				RestartPolicy: corev1.RestartPolicyNever,
				Containers: []corev1.Container{{
					Name: "train", Image: "levers9-runner:test", Command: []string{"true"},
					Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
						kubecluster.GPUResource: resource.MustParse("1"),
					}},
				}},
			}},
		},
	}
	if _, err := cs.BatchV1().Jobs("default").Create(ctx, job, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating the job: %v", err)
	}

	var node string
	var sawRunning bool
	for done := false; !done; {
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for the job's pod (node %q, running seen %v): %v", node, sawRunning, ctx.Err())
		case ev, ok := <-pods.ResultChan():
			if !ok {
				t.Fatal("pod watch closed")
			}
			if ev.Type == watch.Error {
				t.Fatalf("pod watch: %v", apierrors.FromObject(ev.Object))
			}
			pod := ev.Object.(*corev1.Pod)
			if pod.Spec.NodeName != "" {
				node = pod.Spec.NodeName
			}
			switch pod.Status.Phase {
			case corev1.PodRunning:
				if !sawRunning {
					t.Logf("pod %s Running on %s after %v", pod.Name, node, time.Since(created).Round(time.Millisecond))
				}
				sawRunning = true
			case corev1.PodSucceeded:
				done = true
			case corev1.PodFailed:
				t.Fatalf("pod %s failed: %s", pod.Name, pod.Status.Message)
			}
		}
	}
	t.Logf("pod Succeeded after %v", time.Since(created).Round(time.Millisecond))
	if node != kubecluster.GPUNode {
		t.Errorf("pod ran on %q, want %s (the only node with nvidia.com/gpu)", node, kubecluster.GPUNode)
	}
	if !sawRunning {
		t.Error("the pod was never seen Running before it Succeeded")
	}

	testenv.Eventually(t, 30*time.Second, "the job to count one success", func() bool {
		j, err := cs.BatchV1().Jobs("default").Get(ctx, "gpu-job", metav1.GetOptions{})
		if err != nil {
			t.Fatalf("reading the job: %v", err)
		}
		return j.Status.Succeeded == 1
	})
}

// testTooManyGPUs checks the scheduler counts GPUs: five fit nowhere.
func testTooManyGPUs(t *testing.T, c *kubecluster.Cluster) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "five-gpus"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "c", Image: "levers9-runner:test",
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
				kubecluster.GPUResource: *resource.NewQuantity(kubecluster.GPUsPerNode+1, resource.DecimalSI),
			}},
		}}},
	}
	if _, err := c.Clientset().CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating the pod: %v", err)
	}
	testenv.Eventually(t, 30*time.Second, "the scheduler to report the pod unschedulable", func() bool {
		p, err := c.Clientset().CoreV1().Pods("default").Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("reading the pod: %v", err)
		}
		if p.Spec.NodeName != "" {
			t.Fatalf("a pod asking for %d GPUs was bound to %s", kubecluster.GPUsPerNode+1, p.Spec.NodeName)
		}
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodScheduled && cond.Reason == corev1.PodReasonUnschedulable {
				if !strings.Contains(cond.Message, "nvidia.com/gpu") {
					t.Errorf("unschedulable for another reason: %s", cond.Message)
				}
				return true
			}
		}
		return false
	})
}

func TestStopLeavesNothing(t *testing.T) {
	binDir := kubetest.BinDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	start := time.Now()
	c, err := kubecluster.Start(ctx, kubecluster.Options{BinDir: binDir})
	if err != nil {
		t.Fatalf("starting: %v", err)
	}
	t.Logf("started in %v", time.Since(start).Round(time.Millisecond))
	pids := c.PIDs()
	if len(pids) != 5 {
		t.Fatalf("components = %v, want 5", pids)
	}
	dir := c.Dir()

	stopped := time.Now()
	if err := c.Stop(); err != nil {
		t.Fatalf("stopping: %v", err)
	}
	t.Logf("stopped in %v", time.Since(stopped).Round(time.Millisecond))
	for name, pid := range pids {
		// Signal 0 probes: the processes were reaped, so the pids are gone.
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("%s (pid %d) still there after Stop: %v", name, pid, err)
		}
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("cluster directory %s left behind: %v", dir, err)
	}
	if err := c.Stop(); err != nil {
		t.Errorf("second Stop: %v", err)
	}
}

// childEnv makes the test binary the process that starts a cluster and is
// then killed (TestKilledParentLeavesNothing).
const (
	childEnv    = "KUBECLUSTER_TEST_CHILD_BIN_DIR"
	childDirEnv = "KUBECLUSTER_TEST_CHILD_DIR" // in the parent's TempDir, so nothing stays behind
)

func TestMain(m *testing.M) {
	if binDir := os.Getenv(childEnv); binDir != "" {
		runChild(binDir)
		return
	}
	os.Exit(m.Run())
}

// runChild starts a cluster, prints its pids as "NAME=PID ..." and waits to
// be killed.
func runChild(binDir string) {
	c, err := kubecluster.Start(context.Background(), kubecluster.Options{BinDir: binDir, Dir: os.Getenv(childDirEnv)})
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	var b strings.Builder
	for name, pid := range c.PIDs() {
		fmt.Fprintf(&b, "%s=%d ", name, pid)
	}
	fmt.Println("pids:", b.String())
	select {}
}

// TestKilledParentLeavesNothing: when the process that started a cluster is
// killed (a test binary hitting its timeout), the kernel kills the
// components too.
func TestKilledParentLeavesNothing(t *testing.T) {
	binDir := kubetest.BinDir(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self, "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+binDir, childDirEnv+"="+t.TempDir())
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("reading the child's pids: %v", err)
	}
	fields, ok := strings.CutPrefix(strings.TrimSpace(line), "pids: ")
	if !ok {
		t.Fatalf("child: %s", line)
	}
	pids := map[string]int{}
	for _, f := range strings.Fields(fields) {
		name, pid, _ := strings.Cut(f, "=")
		n, err := strconv.Atoi(pid)
		if err != nil {
			t.Fatalf("child pids %q: %v", fields, err)
		}
		pids[name] = n
	}
	if len(pids) != 5 {
		t.Fatalf("child's components = %v, want 5", pids)
	}

	killed := time.Now()
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	for name, pid := range pids {
		testenv.Eventually(t, 10*time.Second, fmt.Sprintf("%s (pid %d) to die with its parent", name, pid), func() bool {
			st, err := procstat.Read(pid)
			return err != nil || st.Exited()
		})
	}
	t.Logf("all %d components gone %v after their parent was killed", len(pids), time.Since(killed).Round(time.Millisecond))
}

// TestStartFailure: a component that dies during Start makes Start fail
// with its log, and leaves no other component running.
func TestStartFailure(t *testing.T) {
	built := kubetest.BinDir(t)
	bin := t.TempDir()
	for _, name := range []string{"etcd", "kube-controller-manager", "kube-scheduler", "kwok", "stages.yaml"} {
		if err := os.Symlink(filepath.Join(built, name), filepath.Join(bin, name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(bin, "kube-apiserver"), []byte("#!/bin/sh\necho 'apiserver: broken on purpose' >&2\nexit 3\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	before := etcdPIDs(t)
	c, err := kubecluster.Start(ctx, kubecluster.Options{BinDir: bin})
	if err == nil {
		c.Stop()
		t.Fatal("Start succeeded with an apiserver that exits")
	}
	for _, want := range []string{"kube-apiserver exited", "broken on purpose"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	for pid := range etcdPIDs(t) {
		if !before[pid] {
			t.Errorf("etcd (pid %d) left running after the failed Start", pid)
		}
	}
}

// etcdPIDs lists running processes whose executable is named etcd.
func etcdPIDs(t *testing.T) map[int]bool {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	pids := map[int]bool{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); err == nil && filepath.Base(exe) == "etcd" {
			if st, err := procstat.Read(pid); err == nil && !st.Exited() {
				pids[pid] = true
			}
		}
	}
	return pids
}
