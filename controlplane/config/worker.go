package config

import (
	"sort"

	"github.com/levers9/levers9/sandbox"
)

// Worker holds what agents apply to containers. Pools may override any key
// of ContainerSecurity.
type Worker struct {
	ContainerSecurity ContainerSecurity `yaml:"containerSecurity"`
	// ContainerServerAuth requires authentication on servers tasks expose.
	ContainerServerAuth bool `yaml:"containerServerAuth"`
	// VolumeMountValidation is log or enforce (default enforce). It judges
	// where volumes mount (submit and agent) and their host sources (agent).
	VolumeMountValidation string `yaml:"volumeMountValidation"`
	// JobResourcesEnforced makes worker pods of Kubernetes pools request the
	// CPU, memory and nvidia.com/gpu of the work they take, so the NVIDIA
	// device plugin hands them GPUs (default true).
	JobResourcesEnforced *bool `yaml:"jobResourcesEnforced"`
	// ImageRegistry is where task images without a registry are pulled
	// from: a registry host[:port], checked at load.
	ImageRegistry string `yaml:"imageRegistry"`
	// DefaultImage runs tasks that name no image.
	DefaultImage string `yaml:"defaultImage"`
	// Pools are the named worker pools.
	Pools map[string]Pool `yaml:"pools"`
	// Kubernetes holds what pools with provider kubernetes share.
	Kubernetes KubeWorkers `yaml:"kubernetes"`
}

// ContainerSecurity is the hardening applied before a container starts.
type ContainerSecurity struct {
	// Profile is legacy or hardened (default hardened).
	Profile string `yaml:"profile"`
	// Seccomp is off, log or enforce (default enforce).
	Seccomp string `yaml:"seccomp"`
	// DropNetRaw removes CAP_NET_RAW (default true).
	DropNetRaw *bool `yaml:"dropNetRaw"`
	// BridgePortIsolation isolates container veths from each other (default true).
	BridgePortIsolation *bool  `yaml:"bridgePortIsolation"`
	Egress              Egress `yaml:"egress"`
	// ApparmorProfile is the AppArmor profile hardened runc containers
	// get on nodes with AppArmor (default levers9-default, which agents
	// load themselves; another name must be loaded by the operator).
	// Nodes without AppArmor run containers without one and say so.
	ApparmorProfile string `yaml:"apparmorProfile"`
}

// Egress is the container egress policy.
type Egress struct {
	// Mode is off, observe or enforce (default enforce).
	Mode string `yaml:"mode"`
	// Allow entries: CIDR, CIDR:port, CIDR:port/proto, [v6CIDR]:port.
	Allow []string `yaml:"allow"`
}

// Pool is one named pool of machines.
type Pool struct {
	// Runtime is runc or runsc (default runc).
	Runtime string `yaml:"runtime"`
	GPUType string `yaml:"gpuType"`
	// NodeSelector selects the pool's machines by label. For pools of
	// joined machines, a machine whose labels (machine create --label)
	// lack any of these is refused when it enrolls. For Kubernetes pools
	// the same key is the worker pods' node selector.
	NodeSelector map[string]string `yaml:"nodeSelector"`
	// VolumeMountValidation overrides worker.volumeMountValidation for
	// this pool (log or enforce); empty inherits.
	VolumeMountValidation string `yaml:"volumeMountValidation"`
	// Security overrides keys of worker.containerSecurity for this pool;
	// unset keys inherit.
	Security ContainerSecurity `yaml:"security"`
	// Shared declares the pool's machines the operator's: they serve
	// tasks of every workspace (or of those in Workspaces). When false
	// (the default) a machine serves only the workspace that enrolled it.
	Shared bool `yaml:"shared"`
	// Workspaces limits a shared pool to these workspaces (IDs or names);
	// empty means every workspace. A machine always serves its own.
	Workspaces []string `yaml:"workspaces"`

	// Provider is machines (joined with machine create, the default) or
	// kubernetes (worker Jobs the controlplane creates on demand; the keys
	// below are for those only). A kubernetes pool's workers are the
	// operator's: they serve every workspace (or those in Workspaces).
	Provider string `yaml:"provider"`
	// MaxWorkers caps the pool's worker Jobs (default 4).
	MaxWorkers int `yaml:"maxWorkers"`
	// Shape is the most one worker pod may take; submit refuses a task
	// larger than it.
	Shape WorkerShape `yaml:"shape"`
	// Tolerations of the worker pods (a tainted GPU node group).
	Tolerations []Toleration `yaml:"tolerations"`
	// RuntimeClassName of the worker pods (required for runsc pools).
	RuntimeClassName string `yaml:"runtimeClassName"`
	// IdleTimeout is how long a worker pod's agent stays without tasks
	// before it exits and its Job is removed (default 5m).
	IdleTimeout string `yaml:"idleTimeout"`
	// PodAnnotations go on the worker pods.
	PodAnnotations map[string]string `yaml:"podAnnotations"`
	// Kubeconfig overrides worker.kubernetes.kubeconfig for this pool.
	Kubeconfig string `yaml:"kubeconfig"`
}

// SharedWith reports whether the pool's machines of other workspaces serve
// tasks of the workspace with this ID and name.
func (p Pool) SharedWith(workspaceID, workspaceName string) bool {
	if !p.IsShared() {
		return false
	}
	if len(p.Workspaces) == 0 {
		return true
	}
	for _, w := range p.Workspaces {
		if w == workspaceID || (workspaceName != "" && w == workspaceName) {
			return true
		}
	}
	return false
}

func boolPtr(b bool) *bool { return &b }

func (w *Worker) withDefaults() {
	cs := &w.ContainerSecurity
	setDefault(&cs.Profile, "hardened")
	setDefault(&cs.Seccomp, "enforce")
	if cs.DropNetRaw == nil {
		cs.DropNetRaw = boolPtr(true)
	}
	if cs.BridgePortIsolation == nil {
		cs.BridgePortIsolation = boolPtr(true)
	}
	setDefault(&cs.Egress.Mode, "enforce")
	setDefault(&cs.ApparmorProfile, sandbox.AppArmorProfileName)
	setDefault(&w.VolumeMountValidation, "enforce")
	if w.JobResourcesEnforced == nil {
		w.JobResourcesEnforced = boolPtr(true)
	}
	if w.Pools == nil {
		w.Pools = map[string]Pool{}
	}
	if _, ok := w.Pools["default"]; !ok {
		w.Pools["default"] = Pool{}
	}
	for name, p := range w.Pools {
		setDefault(&p.Runtime, "runc")
		// shared (false: a machine serves only its own workspace) and
		// workspaces (empty: every workspace, when shared) default to
		// their zero values.
		w.Pools[name] = p
	}
	w.kubeDefaults()
}

// PoolNames is every declared pool, sorted.
func (w *Worker) PoolNames() []string {
	names := make([]string, 0, len(w.Pools))
	for n := range w.Pools {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// EffectiveMountValidation is the pool's volume mount validation: its
// override, or worker.volumeMountValidation.
func (w *Worker) EffectiveMountValidation(pool string) string {
	if p, ok := w.Pools[pool]; ok && p.VolumeMountValidation != "" {
		return p.VolumeMountValidation
	}
	return w.VolumeMountValidation
}

// EffectiveSecurity is the pool's security: the worker's settings with the
// pool's overrides applied on top.
func (w *Worker) EffectiveSecurity(pool string) ContainerSecurity {
	eff := w.ContainerSecurity
	p, ok := w.Pools[pool]
	if !ok {
		return eff
	}
	o := p.Security
	if o.Profile != "" {
		eff.Profile = o.Profile
	}
	if o.Seccomp != "" {
		eff.Seccomp = o.Seccomp
	}
	if o.DropNetRaw != nil {
		eff.DropNetRaw = o.DropNetRaw
	}
	if o.BridgePortIsolation != nil {
		eff.BridgePortIsolation = o.BridgePortIsolation
	}
	if o.Egress.Mode != "" {
		eff.Egress.Mode = o.Egress.Mode
	}
	if o.Egress.Allow != nil {
		eff.Egress.Allow = o.Egress.Allow
	}
	if o.ApparmorProfile != "" {
		eff.ApparmorProfile = o.ApparmorProfile
	}
	return eff
}
