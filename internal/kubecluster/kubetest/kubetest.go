// Package kubetest starts a kubecluster for a test: built by
// packaging/kube/build.sh, stopped at the test's cleanup. When the binaries
// cannot be built the test is skipped, or fails under CI=true (testenv's
// rule): CI must run every test against the real control plane. Test
// support only.
package kubetest

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/levers9/levers9/internal/kubecluster"
	"github.com/levers9/levers9/internal/testenv"
)

// BinDirEnv names an environment variable that may point at a directory of
// already-built binaries, skipping build.sh.
const BinDirEnv = "LEVERS9_KUBE_BIN_DIR"

// Start starts a cluster for t and stops it at cleanup; on failure the tail
// of each component's log goes to the test log.
func Start(t testing.TB) *kubecluster.Cluster {
	t.Helper()
	binDir := BinDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := kubecluster.Start(ctx, kubecluster.Options{BinDir: binDir, Dir: t.TempDir()})
	if err != nil {
		t.Fatalf("starting the Kubernetes control plane: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for name := range c.PIDs() {
				data, _ := os.ReadFile(filepath.Join(c.Dir(), "logs", name+".log"))
				t.Logf("%s log (last 4 KB):\n%s", name, lastBytes(data, 4096))
			}
		}
		if err := c.Stop(); err != nil {
			t.Errorf("stopping the Kubernetes control plane: %v", err)
		}
	})
	return c
}

// BinDir is the binaries' directory: $LEVERS9_KUBE_BIN_DIR when set, else
// what packaging/kube/build.sh builds (instant when warm; `make test` runs
// it first), skipping t when that fails outside CI.
func BinDir(t testing.TB) string {
	t.Helper()
	if dir := os.Getenv(BinDirEnv); dir != "" {
		return dir
	}
	wd, err := os.Getwd()
	if err != nil {
		t.Fatalf("finding the working directory: %v", err)
	}
	script, err := kubecluster.FindBuildScript(wd)
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 45*time.Minute)
		defer cancel()
		var dir string
		if dir, err = kubecluster.Build(ctx, script, nil); err == nil {
			return dir
		}
	}
	testenv.Missing(t, "the Kubernetes binaries (bash %s): %v", kubecluster.BuildScriptPath, err)
	return ""
}

func lastBytes(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// ServiceAccountCan asks the API server (a SubjectAccessReview) whether
// service account ns/name may do a.
func ServiceAccountCan(t testing.TB, cs kubernetes.Interface, ns, name string, a authorizationv1.ResourceAttributes) bool {
	t.Helper()
	sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User:               "system:serviceaccount:" + ns + ":" + name,
		Groups:             []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
		ResourceAttributes: &a,
	}}
	got, err := cs.AuthorizationV1().SubjectAccessReviews().Create(context.Background(), sar, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("SubjectAccessReview: %v", err)
	}
	return got.Status.Allowed
}
