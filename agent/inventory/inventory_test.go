package inventory

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/levers9/levers9/internal/testenv"
)

func TestMain(m *testing.M) {
	// runtimeVersion starts processes and pipe-copying goroutines; none may
	// outlive Collect.
	goleak.VerifyTestMain(m)
}

// fakeGPUs is a GPULister returning fixed results.
type fakeGPUs struct {
	gpus []GPU
	err  error
}

func (f fakeGPUs) GPUs(context.Context) ([]GPU, error) { return f.gpus, f.err }

type bundle struct {
	stateDir string
	logs     *recordingHandler
}

func setup(t *testing.T) bundle {
	t.Helper()
	return bundle{stateDir: t.TempDir(), logs: &recordingHandler{}}
}

func TestCollectThisMachine(t *testing.T) {
	t.Parallel()
	testenv.RequireBinary(t, "runc", "runsc")
	b := setup(t)
	c, err := NewCollector(Config{StateDir: b.stateDir, Logger: slog.New(b.logs)})
	if err != nil {
		t.Fatal(err)
	}
	inv, err := c.Collect(context.Background())
	if err != nil {
		t.Fatalf("Collect: %v", err)
	}
	host, _ := os.Hostname()
	checks := []struct {
		what string
		ok   bool
	}{
		{"hostname is os.Hostname", inv.Hostname == host && host != ""},
		{"OS is linux", inv.OS == "linux"},
		{"Arch is GOARCH", inv.Arch == runtime.GOARCH},
		{"kernel release set", inv.KernelRelease != "" && !strings.ContainsRune(inv.KernelRelease, 0)},
		{"CPU count is NumCPU", inv.CPU.Count == runtime.NumCPU()},
		{"memory at least 256 MiB", inv.MemoryTotalBytes >= 256<<20},
		{"disk path is the state dir", inv.Disk.Path == b.stateDir},
		{"disk total > free > 0", inv.Disk.TotalBytes >= inv.Disk.FreeBytes && inv.Disk.FreeBytes > 0},
		{"runc version", versionRE.MatchString(inv.RuncVersion)},
		{"runsc version", versionRE.MatchString(inv.RunscVersion)},
	}
	for _, c := range checks {
		if !c.ok {
			t.Errorf("%s: got %+v", c.what, inv)
		}
	}
	if runtime.GOARCH == "amd64" && inv.CPU.Model == "" {
		t.Errorf("no CPU model on amd64")
	}
	// The kernel's AppArmor state, read independently.
	b2, err := os.ReadFile("/sys/module/apparmor/parameters/enabled")
	wantAA := err == nil && strings.TrimSpace(string(b2)) == "Y"
	if inv.AppArmorEnabled != wantAA {
		t.Errorf("AppArmorEnabled = %v, want %v", inv.AppArmorEnabled, wantAA)
	}
	if _, err := os.Stat("/dev/nvidiactl"); errors.Is(err, os.ErrNotExist) && len(inv.GPUs) != 0 {
		t.Errorf("GPUs = %+v on a machine without an NVIDIA driver", inv.GPUs)
	}
	for _, l := range b.logs.levels() {
		if l > slog.LevelDebug {
			t.Errorf("Collect logged at %v on a healthy machine", l)
		}
	}
}

// writeFixture writes files under a fresh root, by relative path.
func writeFixture(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for rel, body := range files {
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func TestCollectFixtures(t *testing.T) {
	t.Parallel()
	gpu := GPU{Index: 0, UUID: "GPU-aaa", Name: "NVIDIA L40S", MemoryTotalBytes: 48 << 30, DriverVersion: "550.54.15", CUDADriverVersion: "12.4"}
	noRuntime := filepath.Join("/nonexistent", "l9v", "runc")
	tests := []struct {
		name     string
		proc     map[string]string
		sys      map[string]string
		gpus     fakeGPUs
		check    func(t *testing.T, inv Inventory)
		wantErrs []string
	}{
		{
			name: "healthy",
			proc: map[string]string{"cpuinfo": cpuinfoARM64, "meminfo": "MemTotal: 2048 kB\n"},
			sys:  map[string]string{"module/apparmor/parameters/enabled": "Y\n"},
			gpus: fakeGPUs{gpus: []GPU{gpu}},
			check: func(t *testing.T, inv Inventory) {
				if inv.CPU != (CPU{Count: 4}) || inv.MemoryTotalBytes != 2<<20 || !inv.AppArmorEnabled ||
					len(inv.GPUs) != 1 || inv.GPUs[0] != gpu || inv.RuncVersion != "" || inv.RunscVersion != "" {
					t.Errorf("inventory %+v", inv)
				}
			},
		},
		{
			name: "apparmor off and no apparmor are both false",
			proc: map[string]string{"cpuinfo": cpuinfoX86, "meminfo": "MemTotal: 1 kB\n"},
			sys:  map[string]string{"module/apparmor/parameters/enabled": "N\n"},
			check: func(t *testing.T, inv Inventory) {
				if inv.AppArmorEnabled {
					t.Error("AppArmorEnabled with N")
				}
			},
		},
		{
			name: "every broken fact is named, the rest still reported",
			proc: map[string]string{"cpuinfo": "garbage\n", "meminfo": "MemTotal: lots\n"},
			sys:  map[string]string{"module/apparmor/parameters/enabled": "maybe\n"},
			gpus: fakeGPUs{gpus: []GPU{gpu}, err: errors.New("nvml gpu 1: uuid: ERROR_GPU_IS_LOST")},
			check: func(t *testing.T, inv Inventory) {
				if inv.KernelRelease == "" || inv.Disk.TotalBytes == 0 || len(inv.GPUs) != 1 {
					t.Errorf("readable facts lost: %+v", inv)
				}
			},
			wantErrs: []string{
				`inventory: cpu: `, `no "processor" entries`,
				`inventory: memory: `, `MemTotal: want "N kB", got "lots"`,
				`inventory: apparmor: apparmor enabled parameter: want Y or N, got "maybe\n"`,
				`inventory: gpus: nvml gpu 1: uuid: ERROR_GPU_IS_LOST`,
			},
		},
		{
			name:     "missing procfs files",
			proc:     map[string]string{},
			wantErrs: []string{"inventory: cpu: open ", "cpuinfo: no such file", "inventory: memory: open "},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			c, err := NewCollector(Config{
				StateDir:  b.stateDir,
				GPUs:      tt.gpus,
				Logger:    slog.New(b.logs),
				RuncPath:  noRuntime,
				RunscPath: noRuntime + "sc",
				ProcDir:   writeFixture(t, tt.proc),
				SysDir:    writeFixture(t, tt.sys),
			})
			if err != nil {
				t.Fatal(err)
			}
			inv, err := c.Collect(context.Background())
			if len(tt.wantErrs) == 0 && err != nil {
				t.Fatalf("Collect: %v", err)
			}
			for _, want := range tt.wantErrs {
				if err == nil || !strings.Contains(err.Error(), want) {
					t.Errorf("error %v, want it to contain %q", err, want)
				}
			}
			if tt.check != nil {
				tt.check(t, inv)
			}
		})
	}
}

func TestCollectRuntimeTimeout(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c, err := NewCollector(Config{
		StateDir:       b.stateDir,
		GPUs:           NoGPUs{},
		RuncPath:       testenv.WriteScript(t, "exec sleep 60"),
		RunscPath:      testenv.WriteScript(t, `echo "runsc version release-20231009.0"`),
		CommandTimeout: 200 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	inv, err := c.Collect(context.Background())
	if err == nil || !strings.Contains(err.Error(), "inventory: runc version: ") || !strings.Contains(err.Error(), "no answer within 200ms") {
		t.Fatalf("error %v, want a runc timeout", err)
	}
	if inv.RuncVersion != "" || inv.RunscVersion != "release-20231009.0" || inv.CPU.Count == 0 {
		t.Errorf("inventory %+v", inv)
	}
}

func TestCollectCancelled(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c, err := NewCollector(Config{StateDir: b.stateDir, GPUs: NoGPUs{}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	inv, err := c.Collect(ctx)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("error %v, want context.Canceled", err)
	}
	if inv.Hostname != "" || inv.CPU.Count != 0 {
		t.Errorf("inventory %+v returned with a cancelled context", inv)
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		cfg      Config
		wantErrs []string
	}{
		{name: "ok", cfg: Config{StateDir: "/var/lib/levers9"}},
		{name: "missing state dir", cfg: Config{}, wantErrs: []string{"inventory: StateDir: required"}},
		{
			name: "all problems at once",
			cfg:  Config{StateDir: "state", CommandTimeout: -time.Second},
			wantErrs: []string{
				`inventory: StateDir: "state" is not an absolute path`,
				"inventory: CommandTimeout: -1s is negative",
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := NewCollector(tt.cfg)
			if len(tt.wantErrs) == 0 && err != nil {
				t.Fatalf("NewCollector: %v", err)
			}
			for _, want := range tt.wantErrs {
				if err == nil || !strings.Contains(err.Error(), want) {
					t.Errorf("error %v, want it to contain %q", err, want)
				}
			}
		})
	}
}

func TestCollectMissingStateDir(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "l9v-gone")
	c, err := NewCollector(Config{StateDir: dir, GPUs: NoGPUs{}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Collect(context.Background())
	if err == nil || !strings.Contains(err.Error(), "inventory: disk: statfs "+dir+": no such file or directory") {
		t.Fatalf("error %v, want the disk named", err)
	}
}

func TestParseAppArmorEnabled(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]bool{"Y": true, "Y\n": true, "N\n": false, "N": false} {
		if got, err := parseAppArmorEnabled(in); err != nil || got != want {
			t.Errorf("parseAppArmorEnabled(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "y", "1", "YY"} {
		if _, err := parseAppArmorEnabled(in); err == nil {
			t.Errorf("parseAppArmorEnabled(%q) accepted", in)
		}
	}
}

// A runtime's --version runs once per binary: heartbeats collect often.
// Replacing the binary is noticed.
func TestCollectRuntimeVersionCachedPerBinary(t *testing.T) {
	t.Parallel()
	b := setup(t)
	count := filepath.Join(t.TempDir(), "count")
	runc := testenv.WriteScript(t, `echo x >> `+count+`; echo "runc version 1.1.5"`)
	c, err := NewCollector(Config{StateDir: b.stateDir, GPUs: NoGPUs{}, RuncPath: runc, RunscPath: testenv.WriteScript(t, "exit 0")})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		inv, err := c.Collect(context.Background())
		if inv.RuncVersion != "1.1.5" {
			t.Fatalf("runc version %q (%v)", inv.RuncVersion, err)
		}
	}
	if n, _ := os.ReadFile(count); strings.Count(string(n), "x") != 1 {
		t.Errorf("runc --version ran %d times for 3 collections", strings.Count(string(n), "x"))
	}
	testenv.InstallScript(t, runc, `echo "runc version 1.2.0"`)
	if inv, _ := c.Collect(context.Background()); inv.RuncVersion != "1.2.0" {
		t.Errorf("after replacing the binary: %q", inv.RuncVersion)
	}
}

// versionRE is what the installed runtimes' versions look like.
var versionRE = regexp.MustCompile(`^[0-9A-Za-z][0-9A-Za-z.+~_-]*$`)
