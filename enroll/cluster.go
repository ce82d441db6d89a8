package enroll

import (
	"bytes"
	"fmt"
	"regexp"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/yaml"
)

// ClusterParams fill a `levers9 cluster join` manifest.
type ClusterParams struct {
	MachineID string
	Pool      string
	// Namespace the agent and its worker Jobs live in (default levers9).
	Namespace string
	// Image is the worker image; its levers9-agent runs in cluster mode.
	Image string
	// ControlplaneGRPC is HOST:PORT the agent dials out to.
	ControlplaneGRPC string
	// CAPEM is the controlplane's CA (empty: the system's roots).
	CAPEM string
	Token string
	// ExpiresAt is when the join token stops working (an annotation).
	ExpiresAt time.Time
}

// Names of the objects in a cluster join manifest and what they carry.
// The join layout and labels are shared with the worker Jobs
// (internal/kubeworkers uses these): the cluster agent and the workers run
// the worker image the same way. Here rather than there, so the agent,
// which imports enroll, does not pull in client-go.
const (
	ClusterAgentName   = "levers9-cluster-agent"
	ClusterJoinSecret  = "levers9-cluster-join"
	ClusterJoinDir     = "/etc/levers9/join"
	ClusterStateDir    = "/var/lib/levers9-agent"
	ClusterTokenKey    = "token"
	ClusterCAKey       = "ca.crt"
	KubeLabelApp       = "app.kubernetes.io/name"
	KubeLabelPool      = "levers9.dev/pool"
	KubeLabelMachine   = "levers9.dev/machine-id"
	clusterAnnotExpiry = "levers9.dev/join-expires-at"
	// ClusterAgentLabel marks the machine of an attached cluster's agent
	// (set by the controlplane when cluster_agent is asked).
	ClusterAgentLabel = "levers9.dev/cluster-agent"
	// ClusterNamespaceLabel is the namespace `cluster join` put the
	// agent in, on its machine.
	ClusterNamespaceLabel = "levers9.dev/cluster-namespace"
	// ClusterWorkerLabel marks the machine of a worker Job an attached
	// cluster's agent made; its value is that agent's machine ID. Set by
	// the controlplane only: it decides whose pod reports count and which
	// security the worker's tasks get.
	ClusterWorkerLabel = "levers9.dev/cluster-worker-of"
)

// clusterScript is the cluster agent's shell. The token is copied out of
// the read-only Secret volume because join deletes its token file; a
// container restart (the state dir survives) skips the join, which could
// not succeed twice anyway. Flags come from the Deployment's args as "$@".
const clusterScript = `if [ ! -f ` + ClusterStateDir + `/agent.crt ]; then
  cp ` + ClusterJoinDir + `/` + ClusterTokenKey + ` ` + ClusterStateDir + `/join-token
  ca=""
  if [ -f ` + ClusterJoinDir + `/` + ClusterCAKey + ` ]; then ca="--ca-file=` + ClusterJoinDir + `/` + ClusterCAKey + `"; fi
  levers9-agent join --controlplane "$LEVERS9_CONTROLPLANE" $ca \
    --token-file ` + ClusterStateDir + `/join-token --state-dir ` + ClusterStateDir + `
fi
exec levers9-agent cluster --state-dir ` + ClusterStateDir + ` "$@"
`

var dnsLabel = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

// ClusterManifest is what `levers9 cluster join` prints or applies, in
// apply order: the namespace, the agent's ServiceAccount, a Role limited
// to that namespace (worker Jobs, their pods and logs, their join
// Secrets), a ClusterRole that only reads nodes (the inventory), their
// bindings, the Secret holding the single-use join token, and the
// Deployment of the cluster agent. The token is only ever in the Secret:
// the Deployment mounts it as a file.
func ClusterManifest(p ClusterParams) ([]runtime.Object, error) {
	if p.Namespace == "" {
		p.Namespace = "levers9"
	}
	var errs []error
	if !dnsLabel.MatchString(p.Namespace) {
		errs = append(errs, fmt.Errorf("namespace %q is not a DNS label", p.Namespace))
	}
	for name, v := range map[string]string{"machine id": p.MachineID, "pool": p.Pool,
		"controlplane gRPC address": p.ControlplaneGRPC, "image": p.Image} {
		if !safeWord.MatchString(v) {
			errs = append(errs, fmt.Errorf("%s %q is empty or has characters a manifest should not carry", name, v))
		}
	}
	if _, err := ParseJoinToken(p.Token); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("cluster join manifest: %v", errs)
	}

	ns := p.Namespace
	labels := map[string]string{KubeLabelApp: ClusterAgentName, KubeLabelPool: p.Pool, KubeLabelMachine: p.MachineID}
	meta := func(name string) metav1.ObjectMeta {
		return metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels}
	}
	// Cluster-wide names carry the namespace so two joins side by side
	// (two pools, two namespaces) do not overwrite each other's binding.
	clusterWide := ClusterAgentName + "-" + ns
	sa := []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: ClusterAgentName, Namespace: ns}}

	secretData := map[string][]byte{ClusterTokenKey: []byte(p.Token)}
	if p.CAPEM != "" {
		secretData[ClusterCAKey] = []byte(p.CAPEM)
	}
	secret := &corev1.Secret{ObjectMeta: meta(ClusterJoinSecret), Type: corev1.SecretTypeOpaque, Data: secretData}
	if !p.ExpiresAt.IsZero() {
		secret.Annotations = map[string]string{clusterAnnotExpiry: p.ExpiresAt.UTC().Format(time.RFC3339)}
	}

	one := int32(1)
	no, yes := false, true
	mode := int32(0o400)
	dep := &appsv1.Deployment{
		ObjectMeta: meta(ClusterAgentName),
		Spec: appsv1.DeploymentSpec{
			Replicas: &one,
			// One machine, one certificate: never two agents at once.
			Strategy: appsv1.DeploymentStrategy{Type: appsv1.RecreateDeploymentStrategyType},
			// The selector is immutable: a second join of the same namespace
			// updates the Deployment in place, so it names no machine.
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{KubeLabelApp: ClusterAgentName}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					ServiceAccountName:           ClusterAgentName,
					AutomountServiceAccountToken: &yes, // it talks to its own API server
					EnableServiceLinks:           &no,
					Containers: []corev1.Container{{
						Name:            "agent",
						Image:           p.Image,
						ImagePullPolicy: corev1.PullIfNotPresent,
						Command:         []string{"/bin/sh", "-ec", clusterScript, "levers9-cluster-agent"},
						// Its workers run the image it runs.
						Args: []string{"--namespace", ns, "--pool", p.Pool, "--worker-image", p.Image},
						Env: []corev1.EnvVar{{Name: "LEVERS9_CONTROLPLANE", Value: p.ControlplaneGRPC},
							{Name: "LEVERS9_POOL", Value: p.Pool}},
						// Unlike the workers it makes, the agent itself only
						// talks to two APIs: no privilege at all.
						SecurityContext: &corev1.SecurityContext{
							Privileged:               &no,
							AllowPrivilegeEscalation: &no,
							ReadOnlyRootFilesystem:   &yes,
							Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
							SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
						},
						VolumeMounts: []corev1.VolumeMount{{Name: "join", MountPath: ClusterJoinDir, ReadOnly: true},
							{Name: "state", MountPath: ClusterStateDir}},
					}},
					Volumes: []corev1.Volume{
						{Name: "join", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: ClusterJoinSecret, DefaultMode: &mode}}},
						{Name: "state", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
					},
				},
			},
		},
	}

	objs := []runtime.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{KubeLabelApp: ClusterAgentName}}},
		&corev1.ServiceAccount{ObjectMeta: meta(ClusterAgentName)},
		&rbacv1.Role{ObjectMeta: meta(ClusterAgentName), Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{"batch"}, Resources: []string{"jobs"}, Verbs: []string{"create", "get", "list", "watch", "delete"}},
			{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch"}},
			{APIGroups: []string{""}, Resources: []string{"pods/log"}, Verbs: []string{"get"}},
			// The workers' join Secrets go in and are removed; never read.
			{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"create", "delete"}},
		}},
		&rbacv1.RoleBinding{ObjectMeta: meta(ClusterAgentName), Subjects: sa,
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: ClusterAgentName}},
		&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: clusterWide, Labels: labels}, Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "list", "watch"}},
		}},
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: clusterWide, Labels: labels}, Subjects: sa,
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: clusterWide}},
		secret,
		dep,
	}
	for _, o := range objs {
		setKind(o)
	}
	return objs, nil
}

// setKind fills TypeMeta, which typed objects leave empty but a YAML
// manifest needs.
func setKind(o runtime.Object) {
	var gv, kind string
	switch o.(type) {
	case *corev1.Namespace:
		gv, kind = "v1", "Namespace"
	case *corev1.ServiceAccount:
		gv, kind = "v1", "ServiceAccount"
	case *corev1.Secret:
		gv, kind = "v1", "Secret"
	case *appsv1.Deployment:
		gv, kind = "apps/v1", "Deployment"
	case *rbacv1.Role:
		gv, kind = rbacv1.SchemeGroupVersion.String(), "Role"
	case *rbacv1.RoleBinding:
		gv, kind = rbacv1.SchemeGroupVersion.String(), "RoleBinding"
	case *rbacv1.ClusterRole:
		gv, kind = rbacv1.SchemeGroupVersion.String(), "ClusterRole"
	case *rbacv1.ClusterRoleBinding:
		gv, kind = rbacv1.SchemeGroupVersion.String(), "ClusterRoleBinding"
	}
	o.GetObjectKind().SetGroupVersionKind(schema.FromAPIVersionAndKind(gv, kind))
}

// ManifestYAML joins objects into one multi-document YAML stream.
func ManifestYAML(objs []runtime.Object) ([]byte, error) {
	var b bytes.Buffer
	for i, o := range objs {
		y, err := yaml.Marshal(o)
		if err != nil {
			return nil, fmt.Errorf("writing manifest object %d (%s) as YAML: %w", i, o.GetObjectKind().GroupVersionKind().Kind, err)
		}
		if i > 0 {
			b.WriteString("---\n")
		}
		b.Write(y)
	}
	return b.Bytes(), nil
}
