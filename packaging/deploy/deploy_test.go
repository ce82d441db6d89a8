package deploy

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/levers9/levers9/internal/procstat"
	"github.com/levers9/levers9/internal/testenv"
)

// fakeHelm records its arguments (one per line), a copy of the --values
// file, that file's path and mode, then exits with FAKE_HELM_EXIT or, with
// FAKE_HELM_SLEEP set, says it started and sleeps until killed.
const fakeHelm = `#!/bin/sh
out=$FAKE_HELM_DIR
: > "$out/args"
for a in "$@"; do printf '%s\n' "$a" >> "$out/args"; done
prev=""
for a in "$@"; do
  if [ "$prev" = "--values" ]; then
    printf '%s' "$a" > "$out/path"
    stat -c %a "$a" > "$out/mode"
    cp "$a" "$out/values.yaml"
  fi
  prev=$a
done
if [ -n "$FAKE_HELM_SLEEP" ]; then
  echo $$ > "$out/pid"
  touch "$out/started"
  exec sleep 60
fi
exit "${FAKE_HELM_EXIT:-0}"
`

type bundle struct {
	home, tmp, rec, script string
	env                    []string
}

func setup(t *testing.T) *bundle {
	t.Helper()
	if _, err := exec.LookPath("bash"); err != nil {
		t.Fatal("bash is needed to run deploy.sh")
	}
	_, file, _, _ := runtime.Caller(0)
	b := &bundle{home: t.TempDir(), tmp: t.TempDir(), rec: t.TempDir(), script: filepath.Join(filepath.Dir(file), "deploy.sh")}
	bin := t.TempDir()
	if err := os.WriteFile(filepath.Join(bin, "helm"), []byte(fakeHelm), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(b.home, ".levers9"), 0o700); err != nil {
		t.Fatal(err)
	}
	b.env = []string{"HOME=" + b.home, "TMPDIR=" + b.tmp, "PATH=" + bin + ":/usr/local/bin:/usr/bin:/bin",
		"FAKE_HELM_DIR=" + b.rec, "LANG=C"}
	return b
}

// keys writes a key file under ~/.levers9 (or at an absolute path).
func (b *bundle) keys(t *testing.T, name, content string) string {
	t.Helper()
	path := name
	if !filepath.IsAbs(name) {
		path = filepath.Join(b.home, ".levers9", name)
	}
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func (b *bundle) command(ctx context.Context, env []string, args ...string) (*exec.Cmd, *bytes.Buffer) {
	cmd := exec.CommandContext(ctx, "bash", append([]string{b.script}, args...)...)
	cmd.Env = append(append([]string{}, b.env...), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	return cmd, &out
}

func (b *bundle) run(t *testing.T, env []string, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd, out := b.command(ctx, env, args...)
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return out.String(), 0
	case errors.As(err, &exit):
		return out.String(), exit.ExitCode()
	default:
		t.Fatalf("run deploy.sh: %v", err)
		return "", -1
	}
}

func (b *bundle) recorded(t *testing.T, name string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(b.rec, name))
	if err != nil {
		t.Fatalf("fake helm left no %s: %v", name, err)
	}
	return string(data)
}

// noValuesFileLeft checks TMPDIR holds no values file and the one helm saw
// is gone.
func (b *bundle) noValuesFileLeft(t *testing.T) {
	t.Helper()
	left, _ := filepath.Glob(filepath.Join(b.tmp, "*"))
	if len(left) > 0 {
		t.Errorf("left behind in TMPDIR: %v", left)
	}
	if path, err := os.ReadFile(filepath.Join(b.rec, "path")); err == nil {
		if _, err := os.Stat(string(path)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the values file %s is still there (%v)", path, err)
		}
	}
}

var secrets = []string{"AKIDIMAGES0001", "images/secret+key'quote", "AKIDJUICE0002", "juicefs-secret-0002",
	"AKIDWORK0003", "workspace secret 0003"}

func (b *bundle) allKeys(t *testing.T) []string {
	abs := filepath.Join(t.TempDir(), "workspace.keys")
	b.keys(t, "images.keys", "# images\nACCESS_KEY_ID="+secrets[0]+"\nSECRET_ACCESS_KEY="+secrets[1]+"\n")
	b.keys(t, "juicefs.keys", "export ACCESS_KEY_ID="+secrets[2]+"\r\n\r\nSECRET_ACCESS_KEY="+secrets[3])
	b.keys(t, abs, "SECRET_ACCESS_KEY="+secrets[5]+"\nACCESS_KEY_ID="+secrets[4]+"\n")
	return []string{"LEVERS9_IMAGES_KEYS=images.keys", "LEVERS9_JUICEFS_KEYS=juicefs.keys", "LEVERS9_WORKSPACE_KEYS=" + abs}
}

func TestDeployWritesPrivateValuesAndRemovesThem(t *testing.T) {
	t.Parallel()
	b := setup(t)
	out, code := b.run(t, b.allKeys(t), "--wait", "--set", "controlplane.replicas=3")
	if code != 0 {
		t.Fatalf("deploy.sh exit %d:\n%s", code, out)
	}
	args := strings.Split(strings.TrimSpace(b.recorded(t, "args")), "\n")
	path := b.recorded(t, "path")
	wantPrefix := []string{"upgrade", "--install", "levers9"}
	if strings.Join(args[:3], " ") != strings.Join(wantPrefix, " ") || !strings.HasSuffix(args[3], "/helm/levers9") {
		t.Errorf("helm args %q", args)
	}
	joined := strings.Join(args, " ")
	for _, want := range []string{"--namespace levers9", "--values " + path, "--wait --set controlplane.replicas=3"} {
		if !strings.Contains(joined, want) {
			t.Errorf("helm args %q lack %q", joined, want)
		}
	}
	if !strings.HasPrefix(path, b.tmp+"/") {
		t.Errorf("values file %s not in TMPDIR", path)
	}
	if mode := strings.TrimSpace(b.recorded(t, "mode")); mode != "600" {
		t.Errorf("values file mode %s, want 600", mode)
	}
	for _, s := range secrets {
		// As given, and as the values file quotes it.
		for _, form := range []string{s, strings.ReplaceAll(s, "'", "''")} {
			if strings.Contains(joined, form) {
				t.Errorf("helm's argv holds a key: %q", joined)
			}
			if strings.Contains(out, form) {
				t.Errorf("deploy.sh printed a key:\n%s", out)
			}
		}
	}
	var vals struct {
		ObjectStore map[string]struct {
			AccessKeyID     string `yaml:"accessKeyId"`
			SecretAccessKey string `yaml:"secretAccessKey"`
		} `yaml:"objectStore"`
	}
	if err := yaml.Unmarshal([]byte(b.recorded(t, "values.yaml")), &vals); err != nil {
		t.Fatalf("values file: %v", err)
	}
	for i, store := range []string{"images", "juicefs", "workspace"} {
		got := vals.ObjectStore[store]
		if got.AccessKeyID != secrets[2*i] || got.SecretAccessKey != secrets[2*i+1] {
			t.Errorf("objectStore.%s = %q/%q, want %q/%q", store, got.AccessKeyID, got.SecretAccessKey, secrets[2*i], secrets[2*i+1])
		}
	}
	b.noValuesFileLeft(t)
}

func TestDeployHelmFailureRemovesValues(t *testing.T) {
	t.Parallel()
	b := setup(t)
	out, code := b.run(t, append(b.allKeys(t), "FAKE_HELM_EXIT=3"))
	if code != 3 {
		t.Fatalf("exit %d, want helm's 3:\n%s", code, out)
	}
	b.recorded(t, "values.yaml")
	b.noValuesFileLeft(t)
}

func TestDeployInterruptRemovesValues(t *testing.T) {
	t.Parallel()
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM} {
		t.Run(sig.String(), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			cmd, out := b.command(ctx, append(b.allKeys(t), "FAKE_HELM_SLEEP=1"))
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				if t.Failed() {
					_ = cmd.Process.Kill()
					_ = cmd.Wait()
					t.Logf("deploy.sh output:\n%s", out)
				}
			})
			started := filepath.Join(b.rec, "started")
			testenv.Eventually(t, 20*time.Second, "helm to start", func() bool {
				_, err := os.Stat(started)
				return err == nil
			})
			// The values file exists while helm runs.
			if _, err := os.Stat(b.recorded(t, "path")); err != nil {
				t.Fatalf("values file gone while helm runs: %v", err)
			}
			began := time.Now()
			if err := cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			err := cmd.Wait()
			var exit *exec.ExitError
			want := 128 + int(sig)
			if !errors.As(err, &exit) || exit.ExitCode() != want {
				t.Errorf("after %v: %v, want exit %d\n%s", sig, err, want, out)
			}
			if d := time.Since(began); d > 10*time.Second {
				t.Errorf("deploy.sh took %v to stop", d)
			}
			b.noValuesFileLeft(t)
			pid, err := strconv.Atoi(strings.TrimSpace(b.recorded(t, "pid")))
			if err != nil {
				t.Fatalf("helm's pid: %v", err)
			}
			if st, err := procstat.Read(pid); err == nil && !st.Exited() {
				t.Errorf("helm (pid %d) still runs after deploy.sh stopped", pid)
			}
		})
	}
}

func TestDeployRefusesBadKeyFiles(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, content string
		env           string
		want          string
	}{
		{"missing secret", "ACCESS_KEY_ID=AKIDSHOWNNOWHERE\n", "LEVERS9_JUICEFS_KEYS=k", "SECRET_ACCESS_KEY is missing"},
		{"missing id", "SECRET_ACCESS_KEY=SHOWNNOWHERE\n", "LEVERS9_IMAGES_KEYS=k", "ACCESS_KEY_ID is missing"},
		{"unknown key", "ACCESS_KEY_ID=AKIDSHOWNNOWHERE\nSECRET_KEY=SHOWNNOWHERE\n", "LEVERS9_WORKSPACE_KEYS=k", ":2: unknown key SECRET_KEY"},
		{"not key=value", "SHOWNNOWHERE\n", "LEVERS9_IMAGES_KEYS=k", ":1: not KEY=VALUE"},
		{"no such file", "", "LEVERS9_IMAGES_KEYS=absent", "LEVERS9_IMAGES_KEYS names "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			if tc.content != "" {
				b.keys(t, "k", tc.content)
			}
			out, code := b.run(t, []string{tc.env})
			if code == 0 || !strings.Contains(out, tc.want) {
				t.Errorf("exit %d, output %q; want a failure saying %q", code, out, tc.want)
			}
			if strings.Contains(out, "SHOWNNOWHERE") {
				t.Errorf("the error shows a key: %q", out)
			}
			if _, err := os.Stat(filepath.Join(b.rec, "args")); err == nil {
				t.Error("helm ran despite a bad key file")
			}
			b.noValuesFileLeft(t)
		})
	}
}

func TestDeployWithoutKeyFiles(t *testing.T) {
	t.Parallel()
	b := setup(t)
	out, code := b.run(t, []string{"LEVERS9_RELEASE=lv", "LEVERS9_NAMESPACE=ops"}, "-f", "my-values.yaml")
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	args := b.recorded(t, "args")
	if !strings.HasPrefix(args, "upgrade\n--install\nlv\n") || !strings.Contains(args, "--namespace\nops\n") ||
		!strings.HasSuffix(args, "-f\nmy-values.yaml\n") {
		t.Errorf("helm args %q", args)
	}
	if v := b.recorded(t, "values.yaml"); strings.TrimSpace(v) != "objectStore: {}" {
		t.Errorf("values file %q", v)
	}
	b.noValuesFileLeft(t)
}
