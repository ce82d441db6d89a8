package helmchart

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/levers9/levers9/controlplane/config"
	"github.com/levers9/levers9/controlplane/server"
	"github.com/levers9/levers9/internal/seaweed"
)

const (
	testFilerAddr = "seaweedfs-filer.storage.svc:8888.18888"
	testSWSecret  = "levers9-seaweedfs"
)

func seaweedValues(v map[string]any) map[string]any {
	v = with(v, "volumes.seaweedfs.filerAddr", testFilerAddr)
	return with(v, "volumes.seaweedfs.securitySecret", testSWSecret)
}

// volumeMounts maps a container's mount paths to volume names.
func volumeMounts(c map[string]any) map[string]string {
	out := map[string]string{}
	list, _ := c["volumeMounts"].([]any)
	for _, m := range list {
		m := m.(map[string]any)
		out[m["mountPath"].(string)] = m["name"].(string)
	}
	return out
}

// onHost stands a pod's volumes on this machine: a path in a container
// becomes the same path under the volume's directory in root, and a
// path under none of the container's mounts fails the test.
func onHost(t *testing.T, root string, c map[string]any, p string) string {
	t.Helper()
	for mp, name := range volumeMounts(c) {
		if p == mp || strings.HasPrefix(p, mp+"/") {
			return filepath.Join(root, name, strings.TrimPrefix(p, mp))
		}
	}
	t.Fatalf("%s is on no volume of container %v", p, c["name"])
	return ""
}

// TestVolumesSeaweedFS: volumes.seaweedfs points the controlplane at an
// existing filer. The rendered config has the filer and a securityDir on
// a memory-backed emptyDir; the Secret reaches only the init container,
// 0400 and with exactly the files internal/seaweed reads. Then the pod is
// played on this machine: the Secret's files as kubelet leaves them in a
// pod with an fsGroup (0440), which the controlplane refuses, the init
// container's own args through levers9-controlplane's Main, and the
// rendered config file, which the controlplane then loads with its
// credentials.
func TestVolumesSeaweedFS(t *testing.T) {
	t.Parallel()
	r := mustRender(t, seaweedValues(baseValues()))
	_, cfg := controlplaneConfig(t, r)
	sw, _ := cfg["volumes"].(map[string]any)["seaweedfs"].(map[string]any)
	if sw["filerAddr"] != testFilerAddr || sw["securityDir"] != "/etc/levers9/seaweedfs/security" || sw["filerURL"] != nil {
		t.Errorf("config volumes.seaweedfs = %s", toYAML(sw))
	}

	spec := r.find(t, "Deployment", "levers9-controlplane").get("spec", "template", "spec").(map[string]any)
	if fsGroup := asObject(t, spec).get("securityContext", "fsGroup"); fsGroup == nil {
		t.Fatal("the pod has no fsGroup: this test plays the case the init container is for")
	}
	cs := containers(spec)
	if len(cs) != 2 || cs[0]["name"] != "seaweedfs-credentials" || cs[1]["name"] != "controlplane" {
		t.Fatalf("containers %s, want the init container seaweedfs-credentials, then the controlplane", toYAML(cs))
	}
	initC, cp := cs[0], cs[1]
	if initC["image"] != cp["image"] || toYAML(initC["securityContext"]) != toYAML(cp["securityContext"]) {
		t.Errorf("the init container's image or securityContext differ from the controlplane's:\n%s", toYAML(initC))
	}
	vols := map[string]object{}
	for _, v := range spec["volumes"].([]any) {
		vols[v.(map[string]any)["name"].(string)] = object(v.(map[string]any))
	}
	sec := vols["seaweedfs-secret"]
	if sec.get("secret", "secretName") != testSWSecret || sec.get("secret", "defaultMode") != float64(0o400) {
		t.Errorf("the Secret's volume %s, want %s with defaultMode 0400", toYAML(sec), testSWSecret)
	}
	var items []string
	for _, it := range sec.get("secret", "items").([]any) {
		it := it.(map[string]any)
		if it["key"] != it["path"] {
			t.Errorf("item %v is mounted under another name", it)
		}
		items = append(items, it["key"].(string))
	}
	if !slices.Equal(items, seaweed.SecurityFiles()) {
		t.Errorf("the Secret's items %q, want the files LoadSecurity reads %q", items, seaweed.SecurityFiles())
	}
	if toYAML(vols["seaweedfs"]["emptyDir"]) != "medium: Memory\nsizeLimit: 1Mi" {
		t.Errorf("the credentials' emptyDir %s, want memory-backed", toYAML(vols["seaweedfs"]))
	}
	for mp, name := range volumeMounts(cp) {
		if name == "seaweedfs-secret" {
			t.Errorf("the controlplane mounts the Secret itself at %s", mp)
		}
	}

	// The pod, played here.
	root := t.TempDir()
	src, err := seaweed.EnsureSecurity(filepath.Join(t.TempDir(), "cluster"))
	if err != nil {
		t.Fatal(err)
	}
	secretDir := filepath.Join(root, "seaweedfs-secret")
	if err := os.MkdirAll(secretDir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range items {
		b, err := os.ReadFile(filepath.Join(src.Dir, f))
		if err != nil {
			t.Fatal(err)
		}
		// defaultMode 0400, and group read from the fsGroup.
		if err := os.WriteFile(filepath.Join(secretDir, f), b, 0o440); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(filepath.Join(root, "seaweedfs"), 0o777); err != nil {
		t.Fatal(err)
	}
	if _, err := seaweed.LoadSecurity(secretDir); err == nil {
		t.Fatal("the controlplane would read the mounted Secret as it is: no init container needed")
	}
	var args []string
	for _, a := range initC["args"].([]any) {
		a := a.(string)
		if strings.HasPrefix(a, "/") {
			a = onHost(t, root, initC, a)
		}
		args = append(args, a)
	}
	var stdout, stderr bytes.Buffer
	if err := server.Main(t.Context(), args, func(string) (string, bool) { return "", false }, &stdout, &stderr); err != nil {
		t.Fatalf("the init container %q: %v\n%s", args, err, stderr.String())
	}
	t.Logf("init container: %s", strings.TrimSpace(stdout.String()))
	sw["securityDir"] = onHost(t, root, cp, sw["securityDir"].(string))
	text, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	c, err := config.Load(bytes.NewReader(text), nil)
	if err != nil {
		t.Fatalf("the controlplane refuses the config with the copied credentials: %v", err)
	}
	got, err := seaweed.LoadSecurity(c.Volumes.SeaweedFS.SecurityDir)
	if err != nil || got.FilerWriteKey != src.FilerWriteKey {
		t.Fatalf("the controlplane's credentials: %v", err)
	}
	if c.Volumes.SeaweedFS.FilerURL != "http://seaweedfs-filer.storage.svc:8888" {
		t.Errorf("filer URL %q, want the one filerAddr gives", c.Volumes.SeaweedFS.FilerURL)
	}

	// filerURL, when set, goes to the config as it is.
	_, cfg = controlplaneConfig(t, mustRender(t, with(seaweedValues(baseValues()), "volumes.seaweedfs.filerURL", "https://filer.example.com")))
	if u := asObject(t, cfg).get("volumes", "seaweedfs", "filerURL"); u != "https://filer.example.com" {
		t.Errorf("config volumes.seaweedfs.filerURL = %v", u)
	}
	// Off by default: no config key, no init container, no volumes.
	r = mustRender(t, baseValues())
	if _, cfg := controlplaneConfig(t, r); cfg["volumes"] != nil {
		t.Errorf("default config has volumes: %s", toYAML(cfg["volumes"]))
	}
	if spec := r.find(t, "Deployment", "levers9-controlplane").get("spec", "template", "spec").(map[string]any); spec["initContainers"] != nil ||
		strings.Contains(toYAML(spec["volumes"]), "seaweedfs") {
		t.Errorf("SeaweedFS parts rendered without volumes.seaweedfs:\n%s", toYAML(spec))
	}
}

// TestVolumesSeaweedFSRefused: the schema refuses a filer without its
// credentials, credentials or a URL without a filer, malformed values and
// unknown keys, naming the value; and the chart refuses setting the
// controlplane's keys under config: directly.
func TestVolumesSeaweedFSRefused(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		vals map[string]any
		want string
	}{
		{"filer without securitySecret", with(baseValues(), "volumes.seaweedfs.filerAddr", testFilerAddr), "/volumes/seaweedfs/securitySecret': minLength"},
		{"securitySecret without filer", with(baseValues(), "volumes.seaweedfs.securitySecret", testSWSecret), "/volumes/seaweedfs/filerAddr': minLength"},
		{"filerURL without filer", with(baseValues(), "volumes.seaweedfs.filerURL", "http://filer:8888"), "/volumes/seaweedfs/filerAddr': minLength"},
		{"filerAddr without its port", with(seaweedValues(baseValues()), "volumes.seaweedfs.filerAddr", "filer"), "/volumes/seaweedfs/filerAddr': 'filer' does not match"},
		{"filerURL without a scheme", with(seaweedValues(baseValues()), "volumes.seaweedfs.filerURL", "filer:8888"), "/volumes/seaweedfs/filerURL': 'filer:8888' does not match"},
		{"a Secret name Kubernetes refuses", with(seaweedValues(baseValues()), "volumes.seaweedfs.securitySecret", "Seaweed_FS"), "/volumes/seaweedfs/securitySecret': 'Seaweed_FS' does not match"},
		{"securityDir is the chart's", with(seaweedValues(baseValues()), "volumes.seaweedfs.securityDir", "/x"), "'securityDir' not allowed"},
		{"config.volumes.seaweedfs is the chart's", with(baseValues(), "config.volumes.seaweedfs.filerAddr", testFilerAddr), "config.volumes.seaweedfs is set by the chart: use volumes.seaweedfs."},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := render(t, tc.vals)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("render: %v, want an error naming %s", err, tc.want)
			}
			t.Logf("refused: %v", err)
		})
	}
}
