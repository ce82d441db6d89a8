package release

import (
	"bufio"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// testVersion is stamped instead of git describe, so the test does not
// depend on tags or a dirty tree.
const testVersion = "v9.8.7-releasetest"

var binaries = []string{"levers9", "levers9-controlplane", "levers9-agent", "levers9-dashboard-api"}

// release runs release.sh into dir and returns its stderr.
func release(t *testing.T, dir string) string {
	t.Helper()
	cmd := exec.Command("bash", "release.sh")
	cmd.Env = append(os.Environ(), "DIST="+dir, "VERSION="+testVersion, "ONLY=amd64,arm64", "ARM64_NVML=1")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if out, err := cmd.Output(); err != nil {
		t.Fatalf("release.sh: %v\nstdout: %s\nstderr: %s", err, out, stderr.String())
	}
	return stderr.String()
}

func git(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Env = append(os.Environ(), "TZ=UTC")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("git %v: %v", args, err)
	}
	return strings.TrimSpace(string(out))
}

// TestRelease builds a whole release twice (the second run is mostly the Go
// build cache, but links every binary again) and checks dist/: the flat
// names agentdist serves, sums that match, each binary's ELF machine and
// linking, the stamped version printed by the amd64 binaries, and that the
// two runs wrote the same sums.
func TestRelease(t *testing.T) {
	if testing.Short() {
		t.Skip("builds six binaries, two of them with a C cross compiler")
	}
	for _, tool := range []string{"git", "go", "bash", "sha256sum"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is needed: %v", tool, err)
		}
	}
	// release.sh installs the arm64 cross compiler with apt, which needs
	// root; on a laptop without it the test skips, in CI it must run.
	if _, err := exec.LookPath("aarch64-linux-gnu-gcc"); err != nil && os.Getuid() != 0 && os.Getenv("CI") != "true" {
		t.Skip("aarch64-linux-gnu-gcc is missing and installing it needs root (CI=true fails instead)")
	}
	commit := git(t, "rev-parse", "HEAD")
	day := git(t, "show", "-s", "--date=format-local:%Y-%m-%d", "--format=%cd", "HEAD")

	dir := t.TempDir()
	progress := release(t, dir)
	wantFiles := []string{"SHA256SUMS", "VERSION"}
	arches := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}
	for arch := range arches {
		for _, b := range binaries {
			wantFiles = append(wantFiles, b+"-linux-"+arch)
			if !strings.Contains(progress, "building "+b+" linux/"+arch) {
				t.Errorf("no progress line for %s linux/%s on stderr:\n%s", b, arch, progress)
			}
		}
	}
	slices.Sort(wantFiles)
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range entries {
		got = append(got, e.Name())
	}
	if !slices.Equal(got, wantFiles) {
		t.Fatalf("dist holds %v, want %v", got, wantFiles)
	}
	if v, _ := os.ReadFile(filepath.Join(dir, "VERSION")); string(v) != testVersion+"\n" {
		t.Errorf("VERSION = %q, want %q", v, testVersion+"\n")
	}

	sums := readSums(t, filepath.Join(dir, "SHA256SUMS"))
	if len(sums) != len(wantFiles)-2 {
		t.Errorf("SHA256SUMS has %d lines, want one per binary (%d)", len(sums), len(wantFiles)-2)
	}
	for arch, machine := range arches {
		for _, b := range binaries {
			name := b + "-linux-" + arch
			path := filepath.Join(dir, name)
			if got := fileSum(t, path); sums[name] != got {
				t.Errorf("SHA256SUMS says %s is %q, the file is %q", name, sums[name], got)
			}
			checkELF(t, path, machine, b == "levers9-agent")
		}
	}

	if runtime.GOOS == "linux" && runtime.GOARCH == "amd64" {
		// The stamped line, as version.String formats it.
		want := testVersion + " (commit " + commit[:12] + ", " + day + ")"
		home := t.TempDir() // no CLI config: `levers9 version` asks no controlplane
		for _, tc := range []struct {
			bin  string
			args []string
			want string
		}{
			{"levers9", []string{"version"}, "levers9: " + want + "\n"},
			{"levers9-agent", []string{"--version"}, "levers9-agent " + want + "\n"},
			{"levers9-controlplane", []string{"--version"}, "levers9-controlplane " + want + "\n"},
		} {
			cmd := exec.Command(filepath.Join(dir, tc.bin+"-linux-amd64"), tc.args...)
			cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + home, "LEVERS9_HOME=" + home}
			out, err := cmd.CombinedOutput()
			if err != nil || !strings.HasPrefix(string(out), tc.want) {
				t.Errorf("%s %v = %q, %v; want it to start with %q", tc.bin, tc.args, out, err, tc.want)
			}
		}
	}

	second := t.TempDir()
	release(t, second)
	a, _ := os.ReadFile(filepath.Join(dir, "SHA256SUMS"))
	b, _ := os.ReadFile(filepath.Join(second, "SHA256SUMS"))
	if string(a) != string(b) {
		t.Errorf("two runs on one commit differ:\n%s\nvs\n%s", a, b)
	}
}

// readSums parses sha256sum output: "HEX  NAME" per line.
func readSums(t *testing.T, path string) map[string]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sums := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		sum, name, ok := strings.Cut(sc.Text(), "  ")
		if !ok || len(sum) != 64 {
			t.Fatalf("SHA256SUMS line %q is not sha256sum's format", sc.Text())
		}
		sums[name] = sum
	}
	return sums
}

func fileSum(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// checkELF reads the header only (arm64 binaries are never run): the
// machine, that the CLI, controlplane and dashboard API are static, and that the agent is
// dynamically linked against glibc, which it is only when built with cgo,
// the condition for go-nvml to dlopen libnvidia-ml.
func checkELF(t *testing.T, path string, machine elf.Machine, cgo bool) {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	defer f.Close()
	name := filepath.Base(path)
	if f.Machine != machine {
		t.Errorf("%s: ELF machine %v, want %v", name, f.Machine, machine)
	}
	interp := slices.ContainsFunc(f.Progs, func(p *elf.Prog) bool { return p.Type == elf.PT_INTERP })
	libs, _ := f.ImportedLibraries()
	switch {
	case cgo && (!interp || !slices.Contains(libs, "libc.so.6")):
		t.Errorf("%s: want a cgo binary linked against glibc, got interpreter %v, libraries %v", name, interp, libs)
	case !cgo && (interp || len(libs) > 0):
		t.Errorf("%s: want a static binary, got interpreter %v, libraries %v", name, interp, libs)
	}
	if f.Section(".symtab") != nil {
		t.Errorf("%s: not stripped (has .symtab)", name)
	}
}
