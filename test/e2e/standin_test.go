package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/levers9/levers9/internal/kubeworkers"
	"github.com/levers9/levers9/internal/testenv"
)

// standinAnnotation marks the worker pods a standinKubelet runs; kwok's
// pod stages skip pods carrying it (packaging/kube/kwok/stages.yaml).
const standinAnnotation = "levers9.dev/kubelet"

// standinKubelet stands in for the kubelet of one fake node: it runs the
// worker container of each annotated pod bound to that node as a local
// process (in a test network namespace) with the pod's command, arguments
// and environment, its join Secret written to a temporary directory and
// the pod's paths rewritten to it, and reports the pod Running, then
// Succeeded or Failed as the process exits. A pod being deleted has its
// process group and its runc containers killed (as a kubelet kills the
// pod's cgroup), then its deletion finished.
type standinKubelet struct {
	t               *testing.T
	kube            kubernetes.Interface
	ns, node, netns string
	// env and args are added to every worker container's (the node's
	// fake GPU driver).
	env, args        []string
	stop             context.CancelFunc
	done             chan struct{}
	mu               sync.Mutex
	pods             map[types.UID]*standinPod
	started, stopped []string
}

type standinPod struct {
	name, dir string
	cmd       *exec.Cmd
	out       *testenv.SyncBuffer
	exited    chan struct{}
	killed    bool
}

func startStandin(t *testing.T, kube kubernetes.Interface, ns, node, netns string, env, args []string) *standinKubelet {
	ctx, cancel := context.WithCancel(context.Background())
	k := &standinKubelet{t: t, kube: kube, ns: ns, node: node, netns: netns, env: env, args: args, stop: cancel, done: make(chan struct{}),
		pods: map[types.UID]*standinPod{}}
	go k.loop(ctx)
	t.Cleanup(func() {
		cancel()
		<-k.done
		k.mu.Lock()
		pods := k.pods
		k.mu.Unlock()
		for _, p := range pods {
			k.kill(p)
			if t.Failed() {
				t.Logf("worker pod %s output:\n%s", p.name, p.out.String())
			}
		}
	})
	return k
}

func (k *standinKubelet) loop(ctx context.Context) {
	defer close(k.done)
	for ctx.Err() == nil {
		list, err := k.kube.CoreV1().Pods(k.ns).List(ctx, metav1.ListOptions{})
		if err == nil {
			seen := map[types.UID]bool{}
			for i := range list.Items {
				p := &list.Items[i]
				if p.Spec.NodeName != k.node || p.Annotations[standinAnnotation] == "" {
					continue
				}
				seen[p.UID] = true
				k.mu.Lock()
				sp := k.pods[p.UID]
				k.mu.Unlock()
				switch {
				case sp == nil && p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodPending:
					k.run(ctx, p)
				case sp != nil && p.DeletionTimestamp != nil:
					k.kill(sp)
					zero := int64(0)
					_ = k.kube.CoreV1().Pods(k.ns).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
				}
			}
			k.mu.Lock()
			var gone []*standinPod
			for uid, sp := range k.pods {
				if !seen[uid] {
					gone = append(gone, sp)
				}
			}
			k.mu.Unlock()
			for _, sp := range gone {
				k.kill(sp)
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// run starts a pod's worker container.
func (k *standinKubelet) run(ctx context.Context, p *corev1.Pod) {
	t := k.t
	c := p.Spec.Containers[0]
	sp := &standinPod{name: p.Name, dir: t.TempDir(), out: &testenv.SyncBuffer{}, exited: make(chan struct{})}
	joinDir, stateDir := filepath.Join(sp.dir, "join"), filepath.Join(sp.dir, "state")
	for _, d := range []string{joinDir, stateDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Error(err)
			return
		}
	}
	for _, v := range p.Spec.Volumes {
		if v.Secret == nil {
			continue
		}
		sec, err := k.kube.CoreV1().Secrets(k.ns).Get(ctx, v.Secret.SecretName, metav1.GetOptions{})
		if err != nil {
			return // not there yet: the kubelet waits for it too
		}
		for name, data := range sec.Data {
			if err := os.WriteFile(filepath.Join(joinDir, name), data, 0o600); err != nil {
				t.Error(err)
				return
			}
		}
	}
	rewrite := strings.NewReplacer(kubeworkers.JoinDir, joinDir, kubeworkers.StateDir, stateDir)
	argv := make([]string, 0, len(c.Command)+len(c.Args))
	for _, a := range append(append([]string{}, c.Command...), c.Args...) {
		argv = append(argv, rewrite.Replace(a))
	}
	argv = append(argv, k.args...)
	// nsenter, not `ip netns exec` (see runScript). Without a netns the
	// pod runs in the host's (a cluster agent, which reaches the test API
	// server on 127.0.0.1 and starts no container).
	cmd := exec.Command(argv[0], argv[1:]...)
	if k.netns != "" {
		cmd = exec.Command("nsenter", append([]string{"--net=/run/netns/" + k.netns}, argv...)...)
	}
	cmd.Env = append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH"))
	for _, e := range c.Env {
		cmd.Env = append(cmd.Env, e.Name+"="+e.Value)
	}
	cmd.Env = append(cmd.Env, k.env...)
	cmd.Stdout, cmd.Stderr = sp.out, sp.out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Errorf("starting worker pod %s: %v", p.Name, err)
		return
	}
	sp.cmd = cmd
	k.mu.Lock()
	k.pods[p.UID] = sp
	k.started = append(k.started, p.Name)
	k.mu.Unlock()
	now := metav1.Now()
	p.Status.Phase = corev1.PodRunning
	p.Status.StartTime = &now
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
		{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: now}}
	p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: c.Name, Image: c.Image, Ready: true,
		State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}}}}
	if _, err := k.kube.CoreV1().Pods(k.ns).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Logf("pod %s status Running: %v", p.Name, err)
	}
	go func() {
		err := cmd.Wait()
		close(sp.exited)
		k.mu.Lock()
		killed := sp.killed
		k.mu.Unlock()
		if killed || ctx.Err() != nil {
			return
		}
		code := 0
		if err != nil {
			code = -1
			if ee, ok := err.(*exec.ExitError); ok {
				code = ee.ExitCode()
			}
		}
		k.finish(ctx, p.Name, code)
	}()
}

// finish reports an exited worker container in its pod's status.
func (k *standinKubelet) finish(ctx context.Context, name string, code int) {
	for i := 0; i < 10; i++ {
		p, err := k.kube.CoreV1().Pods(k.ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return
		}
		now := metav1.Now()
		p.Status.Phase = corev1.PodSucceeded
		if code != 0 {
			p.Status.Phase = corev1.PodFailed
		}
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionFalse, LastTransitionTime: now}}
		p.Status.ContainerStatuses[0].Ready = false
		p.Status.ContainerStatuses[0].State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: int32(code), FinishedAt: now}}
		if _, err = k.kube.CoreV1().Pods(k.ns).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err == nil {
			k.mu.Lock()
			k.stopped = append(k.stopped, fmt.Sprintf("%s exit %d", name, code))
			k.mu.Unlock()
			return
		}
	}
}

// kill stops a pod's processes and the containers its agent started.
func (k *standinKubelet) kill(sp *standinPod) {
	k.mu.Lock()
	already := sp.killed
	sp.killed = true
	k.mu.Unlock()
	if already {
		return
	}
	_ = syscall.Kill(-sp.cmd.Process.Pid, syscall.SIGKILL)
	select {
	case <-sp.exited:
	case <-time.After(10 * time.Second):
	}
	roots, _ := filepath.Glob(filepath.Join(sp.dir, "state", "containers", "*", "*", "root"))
	more, _ := filepath.Glob(filepath.Join(sp.dir, "state", "containers", "*", "root"))
	for _, root := range append(roots, more...) {
		out, _ := exec.Command("runc", "--root", root, "list", "-q").Output()
		for _, id := range strings.Fields(string(out)) {
			_ = exec.Command("runc", "--root", root, "delete", "--force", id).Run()
		}
	}
	// The killed agent never unmounted its containers' root filesystems.
	unmountUnder(sp.dir)
}

// unmountUnder lazily unmounts every mount below dir, deepest first.
func unmountUnder(dir string) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return
	}
	var points []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			points = append(points, f[4])
		}
	}
	for i := len(points) - 1; i >= 0; i-- {
		_ = syscall.Unmount(points[i], syscall.MNT_DETACH)
	}
}

// startedPods is the names of the pods started so far, in order.
func (k *standinKubelet) startedPods() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]string(nil), k.started...)
}

// exits is how the pods it ran ended ("NAME exit CODE"), in order.
func (k *standinKubelet) exits() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]string(nil), k.stopped...)
}
