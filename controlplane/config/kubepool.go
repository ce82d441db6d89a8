package config

import (
	"fmt"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
)

// Pool providers: where a pool's workers come from.
const (
	// ProviderMachines: machines joined with `levers9 machine create`.
	ProviderMachines = "machines"
	// ProviderKubernetes: worker Jobs the controlplane creates on demand.
	ProviderKubernetes = "kubernetes"
)

// KubeWorkers holds the worker-wide settings of pools with provider
// kubernetes (worker.kubernetes).
type KubeWorkers struct {
	// Namespace is where worker Jobs, their pods and join Secrets live
	// (default levers9-workers).
	Namespace string `yaml:"namespace"`
	// Image is the worker image. Empty: worker.imageRegistry +
	// "/levers9-worker:" + ImageTag.
	Image string `yaml:"image"`
	// ImageTag is the worker image's tag when Image is empty (default latest).
	ImageTag string `yaml:"imageTag"`
	// Kubeconfig is a kubeconfig file (a mounted Secret) for the cluster
	// worker Jobs run in. Empty: the controlplane's own cluster, through
	// its in-cluster service account.
	Kubeconfig string `yaml:"kubeconfig"`
	// Controlplane is the HOST:PORT worker pods dial to join (their
	// LEVERS9_CONTROLPLANE). Empty: controlplane.publicHost with the
	// port of controlplane.grpcAddr.
	Controlplane string `yaml:"controlplane"`
	// AgentArgs are further `levers9-agent run` flags worker pods get
	// (like --insecure-registries for a registry on plain HTTP).
	AgentArgs []string `yaml:"agentArgs"`
	// ImagePullSecrets name Secrets in Namespace the worker pods pull
	// their image with (a private registry).
	ImagePullSecrets []string `yaml:"imagePullSecrets"`
}

// WorkerShape is the most one worker pod of a Kubernetes pool may take.
type WorkerShape struct {
	// CPU is a Kubernetes quantity ("8", "7500m").
	CPU string `yaml:"cpu"`
	// Memory is a Kubernetes quantity ("32Gi").
	Memory string `yaml:"memory"`
	GPUs   int    `yaml:"gpus"`
}

// Millis is the shape's CPU in millicores (0 when unset or invalid).
func (s WorkerShape) Millis() int64 {
	q, err := resource.ParseQuantity(s.CPU)
	if err != nil {
		return 0
	}
	return q.MilliValue()
}

// Bytes is the shape's memory in bytes (0 when unset or invalid).
func (s WorkerShape) Bytes() int64 {
	q, err := resource.ParseQuantity(s.Memory)
	if err != nil {
		return 0
	}
	return q.Value()
}

// Toleration is a worker pod toleration, as Kubernetes spells it.
type Toleration struct {
	Key      string `yaml:"key"`
	Operator string `yaml:"operator"`
	Value    string `yaml:"value"`
	Effect   string `yaml:"effect"`
}

// IsKubernetes reports whether the pool's workers are Jobs the
// controlplane creates.
func (p Pool) IsKubernetes() bool { return p.Provider == ProviderKubernetes }

// IsShared reports whether the pool's workers serve every workspace it
// allows: a pool declared shared, and every Kubernetes pool (its workers
// are the operator's, made on demand).
func (p Pool) IsShared() bool { return p.Shared || p.IsKubernetes() }

// Idle is how long a worker pod's agent waits without tasks before it exits.
func (p Pool) Idle() time.Duration {
	d, err := time.ParseDuration(p.IdleTimeout)
	if err != nil {
		return 5 * time.Minute
	}
	return d
}

// WorkerImage is the image of worker pods.
func (w *Worker) WorkerImage() string {
	if w.Kubernetes.Image != "" {
		return w.Kubernetes.Image
	}
	reg := w.ImageRegistry
	if reg == "" {
		reg = "docker.io/levers9"
	}
	return reg + "/levers9-worker:" + w.Kubernetes.ImageTag
}

// KubeconfigOf is the kubeconfig path of the pool's cluster ("": in-cluster).
func (w *Worker) KubeconfigOf(pool string) string {
	if p := w.Pools[pool]; p.Kubeconfig != "" {
		return p.Kubeconfig
	}
	return w.Kubernetes.Kubeconfig
}

func (w *Worker) kubeDefaults() {
	setDefault(&w.Kubernetes.Namespace, "levers9-workers")
	setDefault(&w.Kubernetes.ImageTag, "latest")
	for name, p := range w.Pools {
		setDefault(&p.Provider, ProviderMachines)
		if p.IsKubernetes() {
			setDefault(&p.IdleTimeout, "5m")
			if p.MaxWorkers == 0 {
				p.MaxWorkers = 4
			}
		}
		w.Pools[name] = p
	}
}

var tolerationOps = map[string]bool{"": true, "Exists": true, "Equal": true}
var taintEffects = map[string]bool{"": true, "NoSchedule": true, "PreferNoSchedule": true, "NoExecute": true}

// validateKube checks worker.kubernetes and the Kubernetes keys of one pool.
func validateKube(bad func(string, string, ...any), key string, p Pool) {
	if p.Provider != "" { // set after the defaults (tests): machines
		oneOf(bad, key+".provider", p.Provider, ProviderMachines, ProviderKubernetes)
	}
	if !p.IsKubernetes() {
		for k, set := range map[string]bool{"maxWorkers": p.MaxWorkers != 0, "shape": p.Shape != (WorkerShape{}),
			"tolerations": len(p.Tolerations) > 0, "runtimeClassName": p.RuntimeClassName != "", "idleTimeout": p.IdleTimeout != "",
			"podAnnotations": len(p.PodAnnotations) > 0, "kubeconfig": p.Kubeconfig != ""} {
			if set {
				bad(key+"."+k, "only pools with provider: kubernetes take this key")
			}
		}
		return
	}
	if p.MaxWorkers < 1 || p.MaxWorkers > 1000 {
		bad(key+".maxWorkers", "%d is not in 1..1000", p.MaxWorkers)
	}
	if q, err := resource.ParseQuantity(p.Shape.CPU); err != nil || q.MilliValue() < 100 {
		bad(key+".shape.cpu", "%q is not a CPU quantity of at least 100m (like \"8\" or \"7500m\")", p.Shape.CPU)
	}
	if q, err := resource.ParseQuantity(p.Shape.Memory); err != nil || q.Value() < 64<<20 {
		bad(key+".shape.memory", "%q is not a memory quantity of at least 64Mi (like \"32Gi\")", p.Shape.Memory)
	}
	if p.Shape.GPUs < 0 || p.Shape.GPUs > 64 {
		bad(key+".shape.gpus", "%d is not in 0..64", p.Shape.GPUs)
	}
	if d, err := time.ParseDuration(p.IdleTimeout); err != nil || d < time.Second {
		bad(key+".idleTimeout", "%q is not a duration of at least 1s (like 5m)", p.IdleTimeout)
	}
	if p.Runtime == "runsc" && p.RuntimeClassName == "" {
		bad(key+".runtimeClassName", "a runsc pool's worker pods need a RuntimeClass (like gvisor)")
	}
	if p.RuntimeClassName != "" && !poolName.MatchString(p.RuntimeClassName) {
		bad(key+".runtimeClassName", "%q is not a RuntimeClass name", p.RuntimeClassName)
	}
	for i, t := range p.Tolerations {
		k := fmt.Sprintf("%s.tolerations[%d]", key, i)
		if !tolerationOps[t.Operator] {
			bad(k+".operator", "%q is not Exists or Equal", t.Operator)
		}
		if !taintEffects[t.Effect] {
			bad(k+".effect", "%q is not NoSchedule, PreferNoSchedule or NoExecute", t.Effect)
		}
		if t.Operator == "Exists" && t.Value != "" {
			bad(k+".value", "operator Exists takes no value")
		}
		if t.Key == "" && t.Operator != "Exists" {
			bad(k+".key", "an empty key needs operator Exists")
		}
	}
	for k := range p.PodAnnotations {
		if strings.TrimSpace(k) == "" || strings.ContainsAny(k, " \t\n") {
			bad(key+".podAnnotations", "%q is not an annotation name", k)
		}
	}
}

// validateKubeWorkers checks worker.kubernetes when a pool uses it.
func validateKubeWorkers(bad func(string, string, ...any), w Worker) {
	k := w.Kubernetes
	if !poolName.MatchString(k.Namespace) {
		bad("worker.kubernetes.namespace", "%q is not a namespace name", k.Namespace)
	}
	if k.Image == "" && strings.ContainsAny(k.ImageTag, " /:@") {
		bad("worker.kubernetes.imageTag", "%q is not an image tag", k.ImageTag)
	}
	if strings.ContainsAny(k.Image, " \t\n") {
		bad("worker.kubernetes.image", "%q is not an image reference", k.Image)
	}
	if k.Controlplane != "" {
		if i := strings.LastIndex(k.Controlplane, ":"); i <= 0 || i == len(k.Controlplane)-1 {
			bad("worker.kubernetes.controlplane", "%q is not HOST:PORT", k.Controlplane)
		}
	}
}
