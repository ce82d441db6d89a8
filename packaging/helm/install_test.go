package helmchart

import (
	"encoding/base64"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/kube"
	release "helm.sh/helm/v4/pkg/release/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/yaml"

	"github.com/levers9/levers9/controlplane/config"
	"github.com/levers9/levers9/internal/kubecluster"
	"github.com/levers9/levers9/internal/kubecluster/kubetest"
	"github.com/levers9/levers9/internal/kubeworkers"
	"github.com/levers9/levers9/internal/testenv"
)

const (
	releaseNS = "levers9"
	workerNS  = "levers9-workers"
	saUser    = "system:serviceaccount:" + releaseNS + ":levers9-controlplane"
)

// Secret values the install must never copy anywhere but the Secrets.
var installSecrets = map[string]map[string]string{
	"levers9-bootstrap":  {"secret": "SENTINEL-BOOTSTRAP-0123456789abcdef0123456789abcdef"},
	"levers9-encryption": {"key": "SENTINEL-ENCRYPTION-KEY-0123456789abcdef"},
	"levers9-postgres":   {"password": "SENTINEL-POSTGRES-PASSWORD"},
	"levers9-redis":      {"password": "SENTINEL-REDIS-PASSWORD"},
	"levers9-dashboard-env": {"token": "SENTINEL-DASHBOARD-TOKEN", "session-secret": "SENTINEL-DASHBOARD-SESSION-0123456789abcdef0123",
		"google-client-secret": "SENTINEL-GOOGLE-CLIENT-SECRET"},
}

type installBundle struct {
	cluster *kubecluster.Cluster
	cs      kubernetes.Interface
	dyn     dynamic.Interface
	mapper  meta.RESTMapper
	helm    *action.Configuration
}

func setupInstall(t *testing.T) *installBundle {
	t.Helper()
	c := kubetest.Start(t)
	cs := c.Clientset()
	ctx := t.Context()
	for _, ns := range []string{releaseNS, "other"} {
		if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create namespace %s: %v", ns, err)
		}
	}
	for name, data := range installSecrets {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: releaseNS}, StringData: data}
		if _, err := cs.CoreV1().Secrets(releaseNS).Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create Secret %s: %v", name, err)
		}
	}
	dyn, err := dynamic.NewForConfig(c.RESTConfig())
	if err != nil {
		t.Fatalf("dynamic client: %v", err)
	}
	dc, err := discovery.NewDiscoveryClientForConfig(c.RESTConfig())
	if err != nil {
		t.Fatalf("discovery client: %v", err)
	}
	kubeconfig := c.KubeconfigPath()
	ns := releaseNS
	flags := genericclioptions.NewConfigFlags(false)
	flags.KubeConfig, flags.Namespace = &kubeconfig, &ns
	cfg := action.NewConfiguration(action.ConfigurationSetLogger(slog.NewTextHandler(io.Discard, nil)))
	if err := cfg.Init(flags, releaseNS, "secret"); err != nil {
		t.Fatalf("helm configuration: %v", err)
	}
	return &installBundle{cluster: c, cs: cs, dyn: dyn,
		mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc)), helm: cfg}
}

func installValues() map[string]any {
	v := baseValues()
	v = with(v, "redis.existingSecret", "levers9-redis")
	// The worker pods of the l40s pool land on the fake GPU node.
	v = with(v, "pools", map[string]any{
		"default": map[string]any{"nodeSelector": map[string]any{"type": "kwok"}},
		"l40s": map[string]any{"provider": "kubernetes", "nodeSelector": map[string]any{kubecluster.GPULabel: "true"},
			"shape": map[string]any{"cpu": "4", "memory": "8Gi", "gpus": 1}},
	})
	return v
}

func (b *installBundle) install(t *testing.T, vals map[string]any) (*release.Release, error) {
	t.Helper()
	ch, err := loader.Load(chartDir(t))
	if err != nil {
		t.Fatalf("load the chart: %v", err)
	}
	in := action.NewInstall(b.helm)
	in.ReleaseName, in.Namespace = "levers9", releaseNS
	in.Timeout = 2 * time.Minute
	// Objects accepted is what is checked; kwok's pods never serve /healthz.
	in.WaitStrategy = kube.HookOnlyStrategy
	rel, err := in.RunWithContext(t.Context(), ch, deepCopy(vals))
	if err != nil {
		return nil, err
	}
	return rel.(*release.Release), nil
}

func (b *installBundle) upgrade(t *testing.T, vals map[string]any) *release.Release {
	t.Helper()
	ch, err := loader.Load(chartDir(t))
	if err != nil {
		t.Fatalf("load the chart: %v", err)
	}
	up := action.NewUpgrade(b.helm)
	up.Namespace = releaseNS
	up.Timeout = 2 * time.Minute
	up.WaitStrategy = kube.HookOnlyStrategy
	rel, err := up.RunWithContext(t.Context(), "levers9", ch, deepCopy(vals))
	if err != nil {
		t.Fatalf("helm upgrade: %v", err)
	}
	return rel.(*release.Release)
}

// checkAccepted gets every object of the release's manifest back from the
// API server.
func (b *installBundle) checkAccepted(t *testing.T, rel *release.Release) int {
	t.Helper()
	objs, err := splitManifest(rel.Manifest)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		gv, err := schema.ParseGroupVersion(o["apiVersion"].(string))
		if err != nil {
			t.Fatal(err)
		}
		m, err := b.mapper.RESTMapping(gv.WithKind(o.kind()).GroupKind(), gv.Version)
		if err != nil {
			t.Errorf("%s %s: no such resource on the server: %v", o.kind(), o.name(), err)
			continue
		}
		var ri dynamic.ResourceInterface = b.dyn.Resource(m.Resource)
		if m.Scope.Name() == meta.RESTScopeNameNamespace {
			ns, _ := o.get("metadata", "namespace").(string)
			if ns == "" {
				ns = releaseNS
			}
			ri = b.dyn.Resource(m.Resource).Namespace(ns)
		}
		if _, err := ri.Get(t.Context(), o.name(), metav1.GetOptions{}); err != nil {
			t.Errorf("%s %s was not created: %v", o.kind(), o.name(), err)
		}
	}
	return len(objs)
}

// can asks the API server whether the controlplane's service account may
// do this.
func (b *installBundle) can(t *testing.T, a authorizationv1.ResourceAttributes) bool {
	t.Helper()
	sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User:               saUser,
		Groups:             []string{"system:serviceaccounts", "system:serviceaccounts:" + releaseNS, "system:authenticated"},
		ResourceAttributes: &a,
	}}
	got, err := b.cs.AuthorizationV1().SubjectAccessReviews().Create(t.Context(), sar, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("SubjectAccessReview: %v", err)
	}
	return got.Status.Allowed
}

type access struct {
	verb, group, resource, sub, ns string
}

func (a access) String() string {
	r := a.resource
	if a.sub != "" {
		r += "/" + a.sub
	}
	if a.group != "" {
		r += "." + a.group
	}
	return fmt.Sprintf("%s %s in %q", a.verb, r, a.ns)
}

func (b *installBundle) checkRBAC(t *testing.T, legacy bool) {
	t.Helper()
	narrow := []struct {
		access
		allowed bool
	}{
		{access{"create", "batch", "jobs", "", workerNS}, true},
		{access{"delete", "batch", "jobs", "", workerNS}, true},
		// What internal/kubeworkers does besides: list Jobs, watch pods.
		{access{"list", "batch", "jobs", "", workerNS}, true},
		{access{"watch", "", "pods", "", workerNS}, true},
		{access{"get", "", "pods", "log", workerNS}, true},
		{access{"list", "", "pods", "", workerNS}, true},
		{access{"create", "", "secrets", "", workerNS}, true},
		{access{"delete", "", "secrets", "", workerNS}, true},
		{access{"list", "", "nodes", "", ""}, true},
		// Join tokens are written, never read back.
		{access{"get", "", "secrets", "", workerNS}, legacy},
		{access{"get", "", "secrets", "", "other"}, legacy},
		{access{"list", "", "secrets", "", "kube-system"}, legacy},
		{access{"get", "", "secrets", "", releaseNS}, legacy},
		{access{"create", "", "pods", "", "kube-system"}, legacy},
		{access{"create", "batch", "jobs", "", "default"}, legacy},
		{access{"delete", "", "nodes", "", ""}, legacy},
	}
	for _, c := range narrow {
		got := b.can(t, authorizationv1.ResourceAttributes{Verb: c.verb, Group: c.group, Resource: c.resource, Subresource: c.sub, Namespace: c.ns})
		if got != c.allowed {
			t.Errorf("legacyClusterWide=%v: the controlplane may %s: %v, want %v", legacy, c.access, got, c.allowed)
		}
	}
}

// checkNoSecretCopied looks at every ConfigMap, and every container's env
// and arguments, in both namespaces, as the API server has them.
func (b *installBundle) checkNoSecretCopied(t *testing.T) {
	t.Helper()
	var values []string
	for _, data := range installSecrets {
		for _, v := range data {
			values = append(values, v, base64.StdEncoding.EncodeToString([]byte(v)))
		}
	}
	leak := func(where, text string) {
		for _, v := range values {
			if strings.Contains(text, v) {
				t.Errorf("%s holds a secret value", where)
			}
		}
	}
	ctx := t.Context()
	for _, ns := range []string{releaseNS, workerNS} {
		cms, err := b.cs.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, cm := range cms.Items {
			y, _ := yaml.Marshal(cm)
			leak("ConfigMap "+ns+"/"+cm.Name, string(y))
		}
		deps, err := b.cs.AppsV1().Deployments(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range deps.Items {
			for _, c := range d.Spec.Template.Spec.Containers {
				y, _ := yaml.Marshal(map[string]any{"env": c.Env, "args": c.Args, "command": c.Command})
				leak("Deployment "+d.Name+" container "+c.Name, string(y))
				for _, e := range c.Env {
					if e.ValueFrom == nil && (strings.Contains(e.Name, "SECRET") || strings.Contains(e.Name, "PASSWORD") || strings.Contains(e.Name, "KEY")) {
						t.Errorf("env %s is a literal", e.Name)
					}
				}
			}
		}
	}
}

// checkDashboard reads the dashboard's Deployments and Services back from
// the API server: ClusterIP Services selecting their own Deployment's
// pods, and the API's secrets referenced from levers9-dashboard-env.
func (b *installBundle) checkDashboard(t *testing.T) {
	t.Helper()
	ctx := t.Context()
	for _, name := range []string{"levers9-dashboard-api", "levers9-dashboard-web"} {
		d, err := b.cs.AppsV1().Deployments(releaseNS).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Errorf("Deployment %s: %v", name, err)
			continue
		}
		svc, err := b.cs.CoreV1().Services(releaseNS).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Errorf("Service %s: %v", name, err)
			continue
		}
		if svc.Spec.Type != corev1.ServiceTypeClusterIP || svc.Spec.ClusterIP == "" {
			t.Errorf("Service %s: type %s, cluster IP %q", name, svc.Spec.Type, svc.Spec.ClusterIP)
		}
		for k, v := range svc.Spec.Selector {
			if d.Spec.Template.Labels[k] != v {
				t.Errorf("Service %s selects %s=%s, which its pods do not carry", name, k, v)
			}
		}
		if name != "levers9-dashboard-api" {
			continue
		}
		refs := map[string]string{}
		for _, e := range d.Spec.Template.Spec.Containers[0].Env {
			if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
				refs[e.Name] = e.ValueFrom.SecretKeyRef.Name + "/" + e.ValueFrom.SecretKeyRef.Key
			}
		}
		for _, k := range []string{"LEVERS9_DASHBOARD_TOKEN", "LEVERS9_DASHBOARD_SESSION_SECRET", "LEVERS9_DASHBOARD_GOOGLE_CLIENT_SECRET"} {
			if !strings.HasPrefix(refs[k], "levers9-dashboard-env/") {
				t.Errorf("%s: env %s from %q, want levers9-dashboard-env", name, k, refs[k])
			}
		}
	}
}

// startWorkerJob creates the pool's worker Job and join Secret as the
// controlplane builds them (kubeworkers.BuildJob and BuildSecret from the
// config the release installed), as the controlplane's service account,
// and returns the node its pod was scheduled on.
func (b *installBundle) startWorkerJob(t *testing.T, pool string) (string, corev1.ResourceList) {
	t.Helper()
	ctx := t.Context()
	cm, err := b.cs.CoreV1().ConfigMaps(releaseNS).Get(ctx, "levers9-controlplane-config", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the controlplane's config: %v", err)
	}
	cfg, err := config.Load(strings.NewReader(cm.Data["controlplane.yaml"]), nil)
	if err != nil {
		t.Fatalf("the controlplane refuses the installed config: %v", err)
	}
	job := workerJob(t, cfg, pool)
	asSA := b.cluster.RESTConfig()
	asSA.Impersonate = rest.ImpersonationConfig{UserName: saUser, Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + releaseNS, "system:authenticated"}}
	sa, err := kubernetes.NewForConfig(asSA)
	if err != nil {
		t.Fatal(err)
	}
	created, err := sa.BatchV1().Jobs(job.Namespace).Create(ctx, job, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("the controlplane's account could not start a %s worker Job: %v", pool, err)
	}
	if _, err := sa.CoreV1().Secrets(created.Namespace).Create(ctx, kubeworkers.BuildSecret(created, "SENTINEL-JOIN-TOKEN", nil), metav1.CreateOptions{}); err != nil {
		t.Fatalf("the controlplane's account could not create the %s worker's join Secret: %v", pool, err)
	}
	var pod corev1.Pod
	testenv.Eventually(t, 60*time.Second, "the "+pool+" worker pod to be scheduled", func() bool {
		pods, err := sa.CoreV1().Pods(workerNS).List(ctx, metav1.ListOptions{LabelSelector: "job-name=" + created.Name})
		if err != nil {
			t.Fatalf("the controlplane's account could not list worker pods: %v", err)
		}
		if len(pods.Items) == 0 || pods.Items[0].Spec.NodeName == "" {
			return false
		}
		pod = pods.Items[0]
		return true
	})
	if pod.Spec.Containers[0].SecurityContext == nil || !*pod.Spec.Containers[0].SecurityContext.Privileged {
		t.Errorf("the %s worker pod is not privileged", pool)
	}
	prop := metav1.DeletePropagationBackground
	if err := sa.BatchV1().Jobs(workerNS).Delete(ctx, created.Name, metav1.DeleteOptions{PropagationPolicy: &prop}); err != nil {
		t.Errorf("the controlplane's account could not delete its Job: %v", err)
	}
	return pod.Spec.NodeName, pod.Spec.Containers[0].Resources.Requests
}

func TestInstallIntoKubernetes(t *testing.T) {
	b := setupInstall(t)
	ctx := t.Context()

	// Without the required registries nothing is installed, and the error
	// names them.
	_, err := b.install(t, with(with(installValues(), "config.worker.imageRegistry", nil), "config.imageService.runner.baseImageRegistry", nil))
	if err == nil || !strings.Contains(err.Error(), "config.worker.imageRegistry is required") ||
		!strings.Contains(err.Error(), "config.imageService.runner.baseImageRegistry is required") {
		t.Fatalf("install without registries: %v", err)
	}
	if _, err := b.cs.AppsV1().Deployments(releaseNS).Get(ctx, "levers9-controlplane", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("a refused install left the Deployment: %v", err)
	}

	began := time.Now()
	rel, err := b.install(t, installValues())
	if err != nil {
		t.Fatalf("helm install: %v", err)
	}
	t.Logf("helm install: %d objects in %v", b.checkAccepted(t, rel), time.Since(began).Round(time.Millisecond))
	if rel.Info.Status != "deployed" {
		t.Errorf("release status %s", rel.Info.Status)
	}
	b.checkNoSecretCopied(t)
	b.checkRBAC(t, false)

	node, req := b.startWorkerJob(t, "l40s")
	if node != kubecluster.GPUNode {
		t.Errorf("the l40s worker pod runs on %s, want the GPU node %s", node, kubecluster.GPUNode)
	}
	if q := req[kubecluster.GPUResource]; q.Value() != 1 {
		t.Errorf("the l40s worker pod requests %v GPUs, want 1 (jobResourcesEnforced)", q.String())
	}

	// Upgrade: more replicas, the tunnel on a NodePort, the legacy role,
	// the dashboard, an existing SeaweedFS for volumes.
	began = time.Now()
	up := with(with(with(installValues(), "controlplane.replicas", 3), "tunnel.service.type", "NodePort"), "tunnel.service.nodePort", 31995)
	up = seaweedValues(dashboardValues(up))
	rel = b.upgrade(t, with(up, "rbac.legacyClusterWide", true))
	t.Logf("helm upgrade: %d objects in %v", b.checkAccepted(t, rel), time.Since(began).Round(time.Millisecond))
	d, err := b.cs.AppsV1().Deployments(releaseNS).Get(ctx, "levers9-controlplane", metav1.GetOptions{})
	if err != nil || *d.Spec.Replicas != 3 {
		t.Fatalf("after upgrade: replicas %v (%v), want 3", d.Spec.Replicas, err)
	}
	// The API server kept the credentials' init container and volumes as
	// rendered (TestVolumesSeaweedFS checks what they do).
	pod := d.Spec.Template.Spec
	if len(pod.InitContainers) != 1 || pod.InitContainers[0].Name != "seaweedfs-credentials" {
		t.Errorf("after upgrade: init containers %+v, want seaweedfs-credentials", pod.InitContainers)
	}
	for _, v := range pod.Volumes {
		switch {
		case v.Name == "seaweedfs-secret" && (v.Secret == nil || v.Secret.SecretName != testSWSecret || v.Secret.DefaultMode == nil || *v.Secret.DefaultMode != 0o400):
			t.Errorf("after upgrade: volume %+v, want the Secret %s with mode 0400", v, testSWSecret)
		case v.Name == "seaweedfs" && (v.EmptyDir == nil || v.EmptyDir.Medium != corev1.StorageMediumMemory):
			t.Errorf("after upgrade: volume %+v, want a memory-backed emptyDir", v)
		}
	}
	svc, err := b.cs.CoreV1().Services(releaseNS).Get(ctx, "levers9-tunnel", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if svc.Spec.Type != corev1.ServiceTypeNodePort || len(svc.Spec.Ports) != 2 {
		t.Errorf("tunnel Service %s with %d ports", svc.Spec.Type, len(svc.Spec.Ports))
	}
	for _, p := range svc.Spec.Ports {
		if p.NodePort != 31995 {
			t.Errorf("tunnel %s node port %d, want 31995", p.Protocol, p.NodePort)
		}
	}
	b.checkRBAC(t, true)
	b.checkDashboard(t)

	// And back: the wide role goes with the value.
	rel = b.upgrade(t, up)
	b.checkAccepted(t, rel)
	b.checkRBAC(t, false)
	b.checkNoSecretCopied(t)

	began = time.Now()
	un := action.NewUninstall(b.helm)
	un.Timeout = 2 * time.Minute
	un.WaitStrategy = kube.HookOnlyStrategy
	if _, err := un.Run("levers9"); err != nil {
		t.Fatalf("helm uninstall: %v", err)
	}
	t.Logf("helm uninstall in %v", time.Since(began).Round(time.Millisecond))
	gone := func(err error) bool { return apierrors.IsNotFound(err) }
	testenv.Eventually(t, 60*time.Second, "the release's objects to be gone", func() bool {
		_, e1 := b.cs.AppsV1().Deployments(releaseNS).Get(ctx, "levers9-controlplane", metav1.GetOptions{})
		_, e2 := b.cs.RbacV1().ClusterRoles().Get(ctx, "levers9-controlplane-nodes-"+releaseNS, metav1.GetOptions{})
		_, e3 := b.cs.CoreV1().ConfigMaps(releaseNS).Get(ctx, "levers9-controlplane-config", metav1.GetOptions{})
		_, e4 := b.cs.CoreV1().Services(releaseNS).Get(ctx, "levers9-tunnel", metav1.GetOptions{})
		_, e5 := b.cs.AppsV1().Deployments(releaseNS).Get(ctx, "levers9-dashboard-api", metav1.GetOptions{})
		_, e6 := b.cs.CoreV1().Services(releaseNS).Get(ctx, "levers9-dashboard-web", metav1.GetOptions{})
		return gone(e1) && gone(e2) && gone(e3) && gone(e4) && gone(e5) && gone(e6)
	})
	if b.can(t, authorizationv1.ResourceAttributes{Verb: "list", Resource: "nodes"}) {
		t.Error("after uninstall the controlplane's account still lists nodes")
	}
	// The existing Secrets are the operator's and stay.
	if _, err := b.cs.CoreV1().Secrets(releaseNS).Get(ctx, "levers9-bootstrap", metav1.GetOptions{}); err != nil {
		t.Errorf("uninstall removed the operator's Secret: %v", err)
	}
}
