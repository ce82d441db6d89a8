package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/levers9/levers9/enroll"
	"github.com/levers9/levers9/internal/kubeworkers"
)

// fieldManager owns the fields `cluster join --apply` sets (server-side
// apply), so a second join of the same namespace takes them over cleanly.
const fieldManager = "levers9-cluster-join"

// manifestResources maps the kinds of a cluster join manifest to their
// resources; the manifest has no other kind, so no discovery is needed.
var manifestResources = map[string]struct {
	gvr        schema.GroupVersionResource
	namespaced bool
}{
	"Namespace":          {schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}, false},
	"ServiceAccount":     {schema.GroupVersionResource{Version: "v1", Resource: "serviceaccounts"}, true},
	"Secret":             {schema.GroupVersionResource{Version: "v1", Resource: "secrets"}, true},
	"Role":               {schema.GroupVersionResource{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "roles"}, true},
	"RoleBinding":        {schema.GroupVersionResource{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "rolebindings"}, true},
	"ClusterRole":        {schema.GroupVersionResource{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "clusterroles"}, false},
	"ClusterRoleBinding": {schema.GroupVersionResource{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "clusterrolebindings"}, false},
	"Deployment":         {schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"}, true},
}

func (k kubeTarget) restConfig() (*rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = k.kubeconfig
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules,
		&clientcmd.ConfigOverrides{CurrentContext: k.context}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("loading kubeconfig (context %q): %w", k.context, err)
	}
	// Client certificate files are read once: client-go would otherwise
	// start a reloading transport that outlives the command (and a test).
	if err := rest.LoadTLSFiles(cfg); err != nil {
		return nil, fmt.Errorf("reading the TLS files of the kubeconfig: %w", err)
	}
	cfg.CertFile, cfg.KeyFile = "", ""
	return cfg, nil
}

func (k kubeTarget) dynamic() (dynamic.Interface, error) {
	cfg, err := k.restConfig()
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client for %s: %w", cfg.Host, err)
	}
	return dyn, nil
}

// applyManifest server-side-applies objs in order. The Secret's content
// never reaches an error: errors name the kind and object only.
func applyManifest(ctx context.Context, k kubeTarget, objs []runtime.Object) error {
	dyn, err := k.dynamic()
	if err != nil {
		return err
	}
	force := true
	for _, o := range objs {
		kind := o.GetObjectKind().GroupVersionKind().Kind
		res, ok := manifestResources[kind]
		if !ok {
			return fmt.Errorf("manifest kind %s has no known resource", kind)
		}
		acc, err := metaOf(o)
		if err != nil {
			return err
		}
		body, err := json.Marshal(o)
		if err != nil {
			return fmt.Errorf("encoding %s %s: %w", kind, acc.GetName(), err)
		}
		var ri dynamic.ResourceInterface = dyn.Resource(res.gvr)
		if res.namespaced {
			ri = dyn.Resource(res.gvr).Namespace(acc.GetNamespace())
		}
		if _, err := ri.Patch(ctx, acc.GetName(), types.ApplyPatchType, body,
			metav1.PatchOptions{FieldManager: fieldManager, Force: &force}); err != nil {
			return fmt.Errorf("applying %s %s/%s: %w", kind, acc.GetNamespace(), acc.GetName(), err)
		}
	}
	return nil
}

func metaOf(o runtime.Object) (metav1.Object, error) {
	acc, ok := o.(metav1.Object)
	if !ok {
		return nil, fmt.Errorf("manifest object %T has no metadata", o)
	}
	return acc, nil
}

// uninstallCluster removes what `cluster join` put in namespace ns and the
// worker Jobs (with their pods and join Secrets) there. The namespace is
// left: it may hold more than levers9. What is already gone is no error.
func uninstallCluster(ctx context.Context, k kubeTarget, ns string) ([]string, error) {
	dyn, err := k.dynamic()
	if err != nil {
		return nil, err
	}
	clusterWide := enroll.ClusterAgentName + "-" + ns
	bg := metav1.DeletePropagationBackground
	del := metav1.DeleteOptions{PropagationPolicy: &bg}
	var removed []string
	var errs []error
	for _, o := range []struct{ kind, name string }{
		{"Deployment", enroll.ClusterAgentName}, {"Secret", enroll.ClusterJoinSecret},
		{"RoleBinding", enroll.ClusterAgentName}, {"Role", enroll.ClusterAgentName},
		{"ClusterRoleBinding", clusterWide}, {"ClusterRole", clusterWide},
		{"ServiceAccount", enroll.ClusterAgentName},
	} {
		res := manifestResources[o.kind]
		var ri dynamic.ResourceInterface = dyn.Resource(res.gvr)
		if res.namespaced {
			ri = dyn.Resource(res.gvr).Namespace(ns)
		}
		err := ri.Delete(ctx, o.name, del)
		switch {
		case err == nil:
			removed = append(removed, o.kind+" "+o.name)
		case !apierrors.IsNotFound(err):
			errs = append(errs, fmt.Errorf("deleting %s %s: %w", o.kind, o.name, err))
		}
	}
	jobs := schema.GroupVersionResource{Group: "batch", Version: "v1", Resource: "jobs"}
	sel := metav1.ListOptions{LabelSelector: kubeworkers.LabelApp + "=" + kubeworkers.AppName}
	list, err := dyn.Resource(jobs).Namespace(ns).List(ctx, sel)
	if err != nil {
		errs = append(errs, fmt.Errorf("listing worker Jobs: %w", err))
	} else if len(list.Items) > 0 {
		if err := dyn.Resource(jobs).Namespace(ns).DeleteCollection(ctx, del, sel); err != nil {
			errs = append(errs, fmt.Errorf("deleting worker Jobs: %w", err))
		} else {
			removed = append(removed, fmt.Sprintf("%d worker Job(s)", len(list.Items)))
		}
	}
	return removed, errors.Join(errs...)
}
