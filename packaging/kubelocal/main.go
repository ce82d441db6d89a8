// Command kubelocal runs `make kube-up`, `make kube-down` and the status in
// between: the test Kubernetes control plane of internal/kubecluster, kept
// running in the background under .levers9-kube/ of the checkout it is run
// from, with an admin kubeconfig to point kubectl or helm at.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/levers9/levers9/internal/kubecluster"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "kubelocal:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	if len(args) != 1 {
		return errors.New("usage: kubelocal up|down|status")
	}
	root, err := os.Getwd()
	if err != nil {
		return fmt.Errorf("finding the checkout: %w", err)
	}
	dir := filepath.Join(root, ".levers9-kube")
	kubeconfig := filepath.Join(dir, "kubeconfig")
	switch args[0] {
	case "up":
		if ready(ctx, kubeconfig) == nil {
			fmt.Printf("already running\nkubeconfig: %s\nexport KUBECONFIG=%s\n", kubeconfig, kubeconfig)
			return nil
		}
		if err := kubecluster.StopDir(dir); err != nil { // leftovers of a half-dead cluster
			return err
		}
		start := time.Now()
		c, err := kubecluster.Start(ctx, kubecluster.Options{
			Dir:           dir,
			Detached:      true,
			BuildProgress: os.Stderr,
			Logger:        slog.New(slog.NewTextHandler(os.Stderr, nil)),
		})
		if err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "control plane up in %v (logs in %s)\n", time.Since(start).Round(time.Millisecond), filepath.Join(dir, "logs"))
		fmt.Printf("kubeconfig: %s\nexport KUBECONFIG=%s\n", c.KubeconfigPath(), c.KubeconfigPath())
		return nil
	case "down":
		return kubecluster.StopDir(dir)
	case "status":
		if err := ready(ctx, kubeconfig); err != nil {
			return fmt.Errorf("not running: %w", err)
		}
		fmt.Printf("running\nkubeconfig: %s\n", kubeconfig)
		return nil
	}
	return fmt.Errorf("unknown command %q: want up, down or status", args[0])
}

// ready asks the apiserver of the kubeconfig for /readyz.
func ready(ctx context.Context, kubeconfig string) error {
	if _, err := os.Stat(kubeconfig); err != nil {
		return err
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return fmt.Errorf("loading %s: %w", kubeconfig, err)
	}
	cfg.Timeout = 3 * time.Second
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("making a client: %w", err)
	}
	var status int
	if err := cs.Discovery().RESTClient().Get().AbsPath("/readyz").Do(ctx).StatusCode(&status).Error(); err != nil {
		return fmt.Errorf("asking the apiserver: %w", err)
	}
	if status != http.StatusOK {
		return fmt.Errorf("apiserver /readyz answered %d", status)
	}
	return nil
}
