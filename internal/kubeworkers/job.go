package kubeworkers

import (
	"strconv"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/levers9/levers9/enroll"
)

// Labels and annotations on every Job, pod and Secret this package makes.
const (
	LabelApp      = enroll.KubeLabelApp
	AppName       = "levers9-worker"
	LabelPool     = enroll.KubeLabelPool
	LabelMachine  = enroll.KubeLabelMachine
	AnnotCPU      = "levers9.dev/cpu-millis"
	AnnotMemory   = "levers9.dev/memory-bytes"
	AnnotGPUs     = "levers9.dev/gpus"
	GPUResource   = corev1.ResourceName("nvidia.com/gpu")
	ContainerName = "worker"
)

// Paths inside the worker pod, as the chart documents them.
const (
	JoinDir   = enroll.ClusterJoinDir
	TokenKey  = enroll.ClusterTokenKey
	CAKey     = enroll.ClusterCAKey
	StateDir  = enroll.ClusterStateDir
	EnvCP     = "LEVERS9_CONTROLPLANE"
	EnvIdle   = "LEVERS9_EXIT_WHEN_IDLE"
	agentArg0 = "levers9-worker"
)

// Script is the worker container's shell: the token file is copied out of
// the read-only Secret volume because join deletes it; the CA is passed
// when the Secret carries one. Extra agent flags arrive as "$@".
const Script = `cp ` + JoinDir + `/` + TokenKey + ` ` + StateDir + `/join-token
ca=""
if [ -f ` + JoinDir + `/` + CAKey + ` ]; then ca="--ca-file=` + JoinDir + `/` + CAKey + `"; fi
levers9-agent join --controlplane "$` + EnvCP + `" $ca \
  --token-file ` + StateDir + `/join-token --state-dir ` + StateDir + `
exec levers9-agent run --state-dir ` + StateDir + ` --exit-when-idle "$` + EnvIdle + `" "$@"
`

// Spec is one worker Job: a pool's settings and the size of the work it
// is made for.
type Spec struct {
	Pool string
	// MachineID is the machine the worker enrolls as; it names the Job.
	MachineID string
	Image     string
	// Controlplane is the HOST:PORT the agent joins.
	Controlplane string
	// CPUMillis, MemoryBytes and GPUs are what the pod requests when
	// Enforced (and are recorded as annotations either way).
	CPUMillis, MemoryBytes int64
	GPUs                   int
	Enforced               bool
	NodeSelector           map[string]string
	Tolerations            []corev1.Toleration
	RuntimeClassName       string
	IdleTimeout            time.Duration
	PodAnnotations         map[string]string
	// AgentArgs are further `levers9-agent run` flags.
	AgentArgs []string
	// ImagePullSecrets of the worker pod.
	ImagePullSecrets []string
}

// JobName is the Job (and Secret) name of a machine's worker: a DNS
// label of at most 52 characters so the pods' names fit too.
func JobName(pool, machineID string) string {
	if len(pool) > 24 {
		pool = strings.TrimRight(pool[:24], "-")
	}
	return "levers9-worker-" + pool + "-" + strings.ToLower(strings.TrimPrefix(machineID, "m_"))
}

func workerLabels(s Spec) map[string]string {
	return map[string]string{LabelApp: AppName, LabelPool: s.Pool, LabelMachine: s.MachineID}
}

// BuildJob is the worker Job of spec in namespace ns.
func BuildJob(ns string, s Spec) *batchv1.Job {
	name := JobName(s.Pool, s.MachineID)
	// Kubernetes removes a finished Job the controlplane never got to.
	ttl := int32(300)
	zero := int32(0)
	no, yes := false, true
	mode := int32(0o400)
	idle := s.IdleTimeout
	if idle <= 0 {
		idle = 5 * time.Minute
	}
	annots := map[string]string{AnnotCPU: strconv.FormatInt(s.CPUMillis, 10), AnnotMemory: strconv.FormatInt(s.MemoryBytes, 10), AnnotGPUs: strconv.Itoa(s.GPUs)}
	c := corev1.Container{
		Name:            ContainerName,
		Image:           s.Image,
		ImagePullPolicy: corev1.PullIfNotPresent,
		Command:         []string{"/bin/sh", "-ec", Script, agentArg0},
		Args:            s.AgentArgs,
		Env: []corev1.EnvVar{{Name: EnvCP, Value: s.Controlplane}, {Name: EnvIdle, Value: idle.String()},
			{Name: "LEVERS9_POOL", Value: s.Pool}},
		// runc, iptables and the egress chains need a privileged pod; the
		// containers the agent starts get the pool's security.
		SecurityContext: &corev1.SecurityContext{Privileged: &yes},
		VolumeMounts: []corev1.VolumeMount{{Name: "join", MountPath: JoinDir, ReadOnly: true},
			{Name: "state", MountPath: StateDir}},
	}
	if s.Enforced {
		req := corev1.ResourceList{}
		lim := corev1.ResourceList{}
		if s.CPUMillis > 0 {
			req[corev1.ResourceCPU] = *resource.NewMilliQuantity(s.CPUMillis, resource.DecimalSI)
		}
		if s.MemoryBytes > 0 {
			req[corev1.ResourceMemory] = *resource.NewQuantity(s.MemoryBytes, resource.BinarySI)
			lim[corev1.ResourceMemory] = *resource.NewQuantity(s.MemoryBytes, resource.BinarySI)
		}
		if s.GPUs > 0 {
			req[GPUResource] = *resource.NewQuantity(int64(s.GPUs), resource.DecimalSI)
			lim[GPUResource] = *resource.NewQuantity(int64(s.GPUs), resource.DecimalSI)
		}
		c.Resources = corev1.ResourceRequirements{Requests: req, Limits: lim}
	}
	podAnnots := map[string]string{}
	for k, v := range s.PodAnnotations {
		podAnnots[k] = v
	}
	pod := corev1.PodSpec{
		RestartPolicy:                corev1.RestartPolicyNever,
		AutomountServiceAccountToken: &no,
		EnableServiceLinks:           &no,
		NodeSelector:                 s.NodeSelector,
		Tolerations:                  s.Tolerations,
		Containers:                   []corev1.Container{c},
		Volumes: []corev1.Volume{
			{Name: "join", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: name, DefaultMode: &mode}}},
			{Name: "state", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
		},
	}
	if s.RuntimeClassName != "" {
		rc := s.RuntimeClassName
		pod.RuntimeClassName = &rc
	}
	for _, p := range s.ImagePullSecrets {
		pod.ImagePullSecrets = append(pod.ImagePullSecrets, corev1.LocalObjectReference{Name: p})
	}
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: workerLabels(s), Annotations: annots},
		Spec: batchv1.JobSpec{
			// One pod, never replaced: a worker that dies is a new Job.
			BackoffLimit:            &zero,
			TTLSecondsAfterFinished: &ttl,
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: workerLabels(s), Annotations: podAnnots},
				Spec:       pod,
			},
		},
	}
}

// BuildSecret is the join Secret of job: the single-use token and the
// controlplane's CA (when it has its own), owned by the Job so they go
// together.
func BuildSecret(job *batchv1.Job, token string, caPEM []byte) *corev1.Secret {
	data := map[string][]byte{TokenKey: []byte(token)}
	if len(caPEM) > 0 {
		data[CAKey] = caPEM
	}
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: job.Name, Namespace: job.Namespace, Labels: job.Labels,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: job.Name, UID: job.UID}}},
		Type: corev1.SecretTypeOpaque,
		Data: data,
	}
}

func quantityInt(annots map[string]string, key string) int64 {
	n, err := strconv.ParseInt(annots[key], 10, 64)
	if err != nil {
		return 0
	}
	return n
}
