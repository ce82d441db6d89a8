package server

import (
	"fmt"
	"sync"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/levers9/levers9/controlplane/config"
	"github.com/levers9/levers9/controlplane/tasks"
	"github.com/levers9/levers9/internal/kubeworkers"
)

// kubeClients makes the worker Job clients of Kubernetes pools: one per
// cluster (a kubeconfig file, or the in-cluster service account), made on
// first use and kept.
func kubeClients(cfg *config.Config) tasks.KubeClients {
	var mu sync.Mutex
	made := map[string]*kubeworkers.Client{}
	return func(pool string) (*kubeworkers.Client, error) {
		path := cfg.Worker.KubeconfigOf(pool)
		mu.Lock()
		defer mu.Unlock()
		if c, ok := made[path]; ok {
			return c, nil
		}
		var rc *rest.Config
		var err error
		if path == "" {
			rc, err = rest.InClusterConfig()
		} else {
			rc, err = clientcmd.BuildConfigFromFlags("", path)
		}
		if err != nil {
			where := "the in-cluster service account (worker.kubernetes.kubeconfig is empty)"
			if path != "" {
				where = "kubeconfig " + path
			}
			return nil, fmt.Errorf("loading the Kubernetes client of pool %s from %s: %w", pool, where, err)
		}
		// Client certificate files are read once: client-go would otherwise
		// start a reloading transport that lives as long as the process
		// (a rotated certificate in the kubeconfig Secret takes a restart).
		if err := rest.LoadTLSFiles(rc); err != nil {
			return nil, fmt.Errorf("reading the TLS files of the kubeconfig of pool %s: %w", pool, err)
		}
		rc.CertFile, rc.KeyFile = "", ""
		cs, err := kubernetes.NewForConfig(rc)
		if err != nil {
			return nil, fmt.Errorf("making the Kubernetes client of pool %s: %w", pool, err)
		}
		c := kubeworkers.New(cs, cfg.Worker.Kubernetes.Namespace)
		made[path] = c
		return c, nil
	}
}
