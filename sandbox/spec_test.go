package sandbox

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/levers9/levers9/internal/errdefs"
	mobyseccomp "github.com/moby/profiles/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// goldenHost is a fixed node so golden specs are the same everywhere.
func goldenHost() Host {
	return Host{
		Arch: "amd64", Kernel: mobyseccomp.KernelVersion{Kernel: 6, Major: 8}, CPUs: 2, NofileHard: 1 << 20,
		GPUs: GPUInventory{
			GPUs: []GPU{
				{Index: 0, UUID: "GPU-aaaa", Node: DeviceNode{Path: "/dev/nvidia0", Major: 195, Minor: 0}},
				{Index: 1, UUID: "GPU-bbbb", Node: DeviceNode{Path: "/dev/nvidia1", Major: 195, Minor: 1}},
			},
			Control: []DeviceNode{{Path: "/dev/nvidiactl", Major: 195, Minor: 255}, {Path: "/dev/nvidia-uvm", Major: 508, Minor: 0}},
			Libraries: []HostFile{
				{Source: "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54", Destination: "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54"},
				{Source: "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.54", Destination: "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.54"},
			},
		},
	}
}

func goldenTask() TaskSpec {
	return TaskSpec{
		ID: "t1", Rootfs: "/var/lib/levers9/rootfs/t1", Args: []string{"python", "train.py"}, Env: []string{"A=1"},
		Cwd: "/work", Hostname: "t1", Resources: Resources{CPUMillis: 1500, MemoryBytes: 1 << 30, Pids: 512},
		Mounts: []Mount{{Source: "/data/ws1", Destination: "/data", ReadOnly: true}},
	}
}

// goldenSpec is the spec with the seccomp rules summarised (names per
// action plus a hash of the full rules), keeping the files reviewable.
type goldenSpec struct {
	Spec      *specs.Spec    `json:"spec"`
	Seccomp   *seccompDigest `json:"seccomp"`
	Effective Effective      `json:"effective"`
}

type seccompDigest struct {
	DefaultAction specs.LinuxSeccompAction `json:"defaultAction"`
	Architectures []specs.Arch             `json:"architectures"`
	Rules         int                      `json:"rules"`
	Allowed       []string                 `json:"allowed"`
	SHA256        string                   `json:"sha256"`
}

func digest(sc *specs.LinuxSeccomp) *seccompDigest {
	if sc == nil {
		return nil
	}
	b, _ := json.Marshal(sc)
	sum := sha256.Sum256(b)
	d := &seccompDigest{DefaultAction: sc.DefaultAction, Architectures: sc.Architectures, Rules: len(sc.Syscalls), SHA256: hex.EncodeToString(sum[:])}
	for _, r := range sc.Syscalls {
		if r.Action == specs.ActAllow && len(r.Args) == 0 {
			d.Allowed = append(d.Allowed, r.Names...)
		}
	}
	sort.Strings(d.Allowed)
	d.Allowed = slices.Compact(d.Allowed)
	return d
}

func TestGoldenSpecs(t *testing.T) {
	host := goldenHost()
	for _, rt := range bothRuntimes {
		for _, prof := range []Profile{ProfileLegacy, ProfileHardened} {
			for _, sm := range []SeccompMode{SeccompOff, SeccompLog, SeccompEnforce} {
				for _, drop := range []bool{false, true} {
					for _, gpu := range []bool{false, true} {
						name := fmt.Sprintf("%s-%s-%s-netraw%s-gpu%v", rt, prof, sm, map[bool]string{true: "dropped", false: "kept"}[drop], gpu)
						t.Run(name, func(t *testing.T) {
							task := goldenTask()
							if gpu {
								task.GPUs = "GPU-bbbb"
							}
							spec, eff, err := BuildSpec(task, Security{Profile: prof, Seccomp: sm, DropNetRaw: drop, Runtime: rt}, host)
							if err != nil {
								t.Fatal(err)
							}
							g := goldenSpec{Spec: spec, Seccomp: digest(spec.Linux.Seccomp), Effective: eff}
							sc := spec.Linux.Seccomp
							spec.Linux.Seccomp = nil
							got, err := json.MarshalIndent(g, "", "  ")
							spec.Linux.Seccomp = sc
							if err != nil {
								t.Fatal(err)
							}
							path := filepath.Join("testdata", "golden", name+".json")
							if *update {
								if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
									t.Fatal(err)
								}
								if err := os.WriteFile(path, append(got, '\n'), 0o644); err != nil {
									t.Fatal(err)
								}
							}
							want, err := os.ReadFile(path)
							if err != nil {
								t.Fatalf("%v (run with -update to create)", err)
							}
							if !bytes.Equal(bytes.TrimSpace(want), bytes.TrimSpace(got)) {
								t.Errorf("%s differs from golden; run go test -run TestGoldenSpecs -update and review the diff", path)
							}
							checkSpecInvariants(t, spec, eff, prof, sm, drop, gpu, rt)
							if d := g.Seccomp; (d == nil) != (eff.SeccompSHA256 == "") || (d != nil && d.SHA256 != eff.SeccompSHA256) {
								t.Errorf("effective seccomp sha256 %q, spec's profile %+v", eff.SeccompSHA256, d)
							}
						})
					}
				}
			}
		}
	}
}

// checkSpecInvariants states the rules the golden files must obey, so a
// careless -update cannot bless a regression.
func checkSpecInvariants(t *testing.T, s *specs.Spec, eff Effective, prof Profile, sm SeccompMode, drop, gpu bool, rt RuntimeName) {
	t.Helper()
	caps := s.Process.Capabilities.Bounding
	if len(caps) != 14-map[bool]int{true: 1, false: 0}[drop] || slices.Contains(caps, "CAP_NET_RAW") == drop {
		t.Errorf("capabilities %v with dropNetRaw=%v", caps, drop)
	}
	for _, c := range []string{"CAP_SYS_ADMIN", "CAP_SYS_NICE", "CAP_SYS_PTRACE"} {
		if slices.Contains(caps, c) {
			t.Errorf("has %s", c)
		}
	}
	if len(s.Process.Capabilities.Inheritable) != 0 {
		t.Error("inheritable capabilities set")
	}
	if (s.Linux.Sysctl["net.ipv4.ping_group_range"] != "") != drop {
		t.Errorf("ping_group_range %q with dropNetRaw=%v", s.Linux.Sysctl["net.ipv4.ping_group_range"], drop)
	}
	for _, rl := range s.Process.Rlimits {
		if rl.Hard > maxNofile || rl.Soft > rl.Hard {
			t.Errorf("rlimit %+v above %d", rl, maxNofile)
		}
	}
	hardened := prof == ProfileHardened
	if s.Process.NoNewPrivileges != hardened || eff.NoNewPrivileges != hardened {
		t.Errorf("noNewPrivileges %v for %s", s.Process.NoNewPrivileges, prof)
	}
	if slices.Contains(s.Linux.MaskedPaths, "/proc/interrupts") != hardened ||
		slices.Contains(s.Linux.MaskedPaths, "/sys/devices/system/cpu/cpu1/thermal_throttle") != hardened {
		t.Errorf("masked paths %v for %s", s.Linux.MaskedPaths, prof)
	}
	if slices.Contains(s.Linux.MaskedPaths, "/proc/driver/nvidia") != (hardened && !gpu) {
		t.Errorf("/proc/driver/nvidia masked=%v with gpu=%v", !gpu, gpu)
	}
	if eff.MaskedPaths != (hardened && rt == RuntimeRunc) {
		t.Errorf("effective maskedPaths %v for %s/%s", eff.MaskedPaths, rt, prof)
	}
	wantSC := sm
	if rt == RuntimeRunsc && sm == SeccompLog {
		wantSC = SeccompOff
	}
	if eff.Seccomp != wantSC || (s.Linux.Seccomp == nil) != (wantSC == SeccompOff) {
		t.Errorf("seccomp effective %s, spec has profile %v; want %s", eff.Seccomp, s.Linux.Seccomp != nil, wantSC)
	}
	if sc := s.Linux.Seccomp; sc != nil {
		wantDefault := specs.ActErrno
		if wantSC == SeccompLog {
			wantDefault = specs.ActLog
		}
		if sc.DefaultAction != wantDefault {
			t.Errorf("seccomp default %s, want %s", sc.DefaultAction, wantDefault)
		}
		allowed := digest(sc).Allowed
		for _, n := range gpuSyscalls {
			if slices.Contains(allowed, n) != gpu {
				t.Errorf("seccomp allows %s=%v with gpu=%v", n, !gpu, gpu)
			}
		}
	}
	if gpu {
		if !slices.ContainsFunc(s.Linux.Devices, func(d specs.LinuxDevice) bool { return d.Path == "/dev/nvidia1" }) ||
			slices.ContainsFunc(s.Linux.Devices, func(d specs.LinuxDevice) bool { return d.Path == "/dev/nvidia0" }) {
			t.Errorf("devices %v, want only GPU 1", s.Linux.Devices)
		}
		if !slices.Contains(s.Process.Env, "NVIDIA_VISIBLE_DEVICES=GPU-bbbb") {
			t.Errorf("env %v", s.Process.Env)
		}
	}
	for _, m := range s.Mounts {
		if m.Type == "bind" && (!slices.Contains(m.Options, "nosuid") || !slices.Contains(m.Options, "nodev")) {
			t.Errorf("bind mount %s without nosuid,nodev: %v", m.Destination, m.Options)
		}
	}
}

func TestSeccompMatchesMoby(t *testing.T) {
	host, err := DetectHost(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	noRaw := slices.DeleteFunc(slices.Clone(defaultCaps), func(c string) bool { return c == "CAP_NET_RAW" })
	for name, caps := range map[string][]string{
		"docker-default": defaultCaps, "net-raw-dropped": noRaw,
		"with-sys-admin-ptrace": append(slices.Clone(defaultCaps), "CAP_SYS_ADMIN", "CAP_SYS_PTRACE", "CAP_SYS_NICE"),
	} {
		t.Run(name, func(t *testing.T) {
			want, err := mobyseccomp.GetDefaultProfile(&specs.Spec{Process: &specs.Process{Capabilities: &specs.LinuxCapabilities{Bounding: caps}}})
			if err != nil {
				t.Fatal(err)
			}
			got, err := resolveSeccomp(caps, runtime.GOARCH, host.Kernel)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, want) {
				gb, _ := json.Marshal(got)
				wb, _ := json.Marshal(want)
				t.Errorf("resolved profile differs from moby's (%d vs %d bytes)", len(gb), len(wb))
			}
		})
	}
	// And the kernel filter really matters: an old kernel loses rules.
	old, _ := resolveSeccomp(defaultCaps, "amd64", mobyseccomp.KernelVersion{Kernel: 4, Major: 0})
	cur, _ := resolveSeccomp(defaultCaps, "amd64", mobyseccomp.KernelVersion{Kernel: 6, Major: 8})
	if reflect.DeepEqual(old, cur) {
		t.Error("kernel version does not change the resolved profile")
	}
}

// TestSeccompArchitectures: the x32 architecture, one more filter for runc
// to compile at each start, is listed only where the kernel runs x32
// syscalls; the 32-bit x86 one always stays.
func TestSeccompArchitectures(t *testing.T) {
	for _, tc := range []struct {
		arch string
		x32  bool
		want []specs.Arch
	}{
		{"amd64", false, []specs.Arch{specs.ArchX86_64, specs.ArchX86}},
		{"amd64", true, []specs.Arch{specs.ArchX86_64, specs.ArchX86, specs.ArchX32}},
		{"arm64", false, []specs.Arch{specs.ArchAARCH64, specs.ArchARM}},
	} {
		h := goldenHost()
		h.Arch, h.X32 = tc.arch, tc.x32
		for _, mode := range []SeccompMode{SeccompEnforce, SeccompLog} {
			sc, err := seccompFor(mode, defaultCaps, false, h)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(sc.Architectures, tc.want) {
				t.Errorf("%s x32=%v %s: architectures %v, want %v", tc.arch, tc.x32, mode, sc.Architectures, tc.want)
			}
		}
	}
	// Dropping x32 leaves moby's own profile alone.
	if p := mobyseccomp.DefaultProfile(); !slices.ContainsFunc(p.ArchMap, func(m mobyseccomp.Architecture) bool {
		return m.Arch == specs.ArchX86_64 && slices.Contains(m.SubArches, specs.ArchX32)
	}) {
		t.Error("moby's default profile lost x32 from amd64's sub-architectures")
	}
}

func TestSeccompUnfiltered(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		status string
		want   bool
	}{
		{"Name:\tagent\nSeccomp:\t0\nSeccomp_filters:\t0\n", true},
		{"Name:\tagent\nSeccomp:\t2\nSeccomp_filters:\t1\n", false},
		{"Name:\tagent\n", false},
	} {
		path := filepath.Join(dir, "status")
		if err := os.WriteFile(path, []byte(tc.status), 0o600); err != nil {
			t.Fatal(err)
		}
		if got := seccompUnfiltered(path); got != tc.want {
			t.Errorf("%q: unfiltered=%v, want %v", tc.status, got, tc.want)
		}
	}
	if seccompUnfiltered(filepath.Join(dir, "missing")) {
		t.Error("an unreadable status counts as unfiltered")
	}
}

func TestBuildSpecNoNewPrivilegesExceptions(t *testing.T) {
	host := goldenHost()
	for _, tc := range []struct {
		name    string
		mutate  func(*TaskSpec, *Security)
		wantNNP bool
	}{
		{"root image", func(*TaskSpec, *Security) {}, true},
		{"task user override keeps nnp", func(tk *TaskSpec, _ *Security) { tk.User = "1000" }, true},
		{"non-root image", func(tk *TaskSpec, _ *Security) { tk.ImageUser = "1000:1000" }, false},
		{"non-root image, exception denied", func(tk *TaskSpec, s *Security) {
			tk.ImageUser = "1000"
			s.NoNewPrivilegesExceptions.DenyNonRootImageUser = true
		}, true},
		{"docker in docker", func(tk *TaskSpec, _ *Security) { tk.DockerInDocker = true }, false},
		{"docker in docker, exception denied", func(tk *TaskSpec, s *Security) {
			tk.DockerInDocker = true
			s.NoNewPrivilegesExceptions.DenyDockerInDocker = true
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			task, sec := goldenTask(), Security{Profile: ProfileHardened, Seccomp: SeccompEnforce, Runtime: RuntimeRunc}
			tc.mutate(&task, &sec)
			s, eff, err := BuildSpec(task, sec, host)
			if err != nil {
				t.Fatal(err)
			}
			if s.Process.NoNewPrivileges != tc.wantNNP || eff.NoNewPrivileges != tc.wantNNP {
				t.Errorf("noNewPrivileges %v, want %v (notes %v)", s.Process.NoNewPrivileges, tc.wantNNP, eff.Notes)
			}
		})
	}
}

func TestBuildSpecNonRootHasNoEffectiveCaps(t *testing.T) {
	task := goldenTask()
	task.User = "1000:1000"
	s, _, err := BuildSpec(task, Security{Profile: ProfileHardened, Seccomp: SeccompEnforce, Runtime: RuntimeRunc}, goldenHost())
	if err != nil {
		t.Fatal(err)
	}
	if c := s.Process.Capabilities; len(c.Effective)+len(c.Permitted)+len(c.Ambient) != 0 || len(c.Bounding) != 14 {
		t.Errorf("caps for uid 1000: %+v", c)
	}
	if s.Process.User.UID != 1000 || s.Process.User.GID != 1000 {
		t.Errorf("user %+v", s.Process.User)
	}
}

func TestBuildSpecAppArmor(t *testing.T) {
	for _, tc := range []struct {
		name    string
		enabled bool
		loaded  []string
		rt      RuntimeName
		want    string
		wantEff string
	}{
		{"no apparmor on node", false, nil, RuntimeRunc, "", ""},
		{"enabled, profile not loaded", true, []string{"docker-default"}, RuntimeRunc, "", ""},
		{"enabled and loaded", true, []string{AppArmorProfileName}, RuntimeRunc, AppArmorProfileName, AppArmorProfileName},
		{"runsc ignores it", true, []string{AppArmorProfileName}, RuntimeRunsc, AppArmorProfileName, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := goldenHost()
			h.AppArmorEnabled, h.AppArmorProfiles = tc.enabled, tc.loaded
			s, eff, err := BuildSpec(goldenTask(), Security{Profile: ProfileHardened, Seccomp: SeccompEnforce, Runtime: tc.rt}, h)
			if err != nil {
				t.Fatal(err)
			}
			if s.Process.ApparmorProfile != tc.want || eff.AppArmorProfile != tc.wantEff {
				t.Errorf("spec %q effective %q, want %q %q", s.Process.ApparmorProfile, eff.AppArmorProfile, tc.want, tc.wantEff)
			}
		})
	}
}

func TestBuildSpecNofileFollowsHost(t *testing.T) {
	for _, hard := range []uint64{1 << 20, 20000, 4096} {
		h := goldenHost()
		h.NofileHard = hard
		s, _, err := BuildSpec(goldenTask(), Security{Profile: ProfileHardened, Seccomp: SeccompOff, Runtime: RuntimeRunc}, h)
		if err != nil {
			t.Fatal(err)
		}
		if got := s.Process.Rlimits[0].Hard; got != min(hard, maxNofile) {
			t.Errorf("host hard %d: spec hard %d", hard, got)
		}
	}
}

func TestBuildSpecErrorsNameFields(t *testing.T) {
	bad := TaskSpec{ID: "bad id!", Rootfs: "relative", Env: []string{"NOEQUALS"}, User: "alice:", Cwd: "rel",
		Resources: Resources{MemoryBytes: 1}, Mounts: []Mount{{Source: "x", Destination: "/"}}}
	_, _, err := BuildSpec(bad, Security{Profile: "paranoid", Seccomp: "strict", Runtime: "kata"}, goldenHost())
	if !errdefs.IsInvalidArgument(err) {
		t.Fatalf("error kind: %v", err)
	}
	_, _, err = BuildSpec(bad, Security{}.WithDefaults(), goldenHost())
	for _, want := range []string{"task.id", "task.rootfs", "task.args", "task.env[0]", "task.user", "task.cwd", "task.resources.memoryBytes", "task.mounts[0].source", "task.mounts[0].destination"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error does not name %s: %v", want, err)
		}
	}
	err = Security{Profile: "paranoid", Seccomp: "strict", Runtime: "kata"}.Validate()
	for _, want := range []string{".profile", ".seccomp", ".runtime"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error does not name %s: %v", want, err)
		}
	}
}

func TestTighten(t *testing.T) {
	pool := Security{Profile: ProfileHardened, Seccomp: SeccompLog, Runtime: RuntimeRunc}
	for _, tc := range []struct {
		env     []string
		want    Security
		errKind func(error) bool
	}{
		{nil, pool, nil},
		{[]string{"LEVERS9_SECCOMP=enforce"}, Security{Profile: ProfileHardened, Seccomp: SeccompEnforce, Runtime: RuntimeRunc}, nil},
		{[]string{"LEVERS9_SECCOMP=log", "LEVERS9_SECURITY_PROFILE=hardened"}, pool, nil},
		{[]string{"LEVERS9_SECCOMP=off"}, pool, errdefs.IsPermissionDenied},
		{[]string{"LEVERS9_SECURITY_PROFILE=legacy"}, pool, errdefs.IsPermissionDenied},
		{[]string{"LEVERS9_SECCOMP=strict"}, pool, errdefs.IsInvalidArgument},
		{[]string{"OTHER=1", "LEVERS9_SECCOMPX=off"}, pool, nil},
		{[]string{"LEVERS9_VOLUME_MOUNT_VALIDATION=enforce"}, Security{Profile: ProfileHardened, Seccomp: SeccompLog, Runtime: RuntimeRunc, MountValidation: MountValidationEnforce}, nil},
		{[]string{"LEVERS9_VOLUME_MOUNT_VALIDATION=log"}, pool, nil},
		{[]string{"LEVERS9_VOLUME_MOUNT_VALIDATION=off"}, pool, errdefs.IsInvalidArgument},
	} {
		got, err := Tighten(pool, tc.env)
		if tc.errKind == nil && err != nil || tc.errKind != nil && !tc.errKind(err) {
			t.Errorf("env %v: error %v", tc.env, err)
		}
		if err != nil && !strings.Contains(err.Error(), "LEVERS9_") {
			t.Errorf("env %v: error does not name the variable: %v", tc.env, err)
		}
		if got != tc.want {
			t.Errorf("env %v: %+v, want %+v", tc.env, got, tc.want)
		}
	}
	legacyPool := Security{Profile: ProfileLegacy, Seccomp: SeccompOff, Runtime: RuntimeRunc}
	got, err := Tighten(legacyPool, []string{"LEVERS9_SECURITY_PROFILE=hardened", "LEVERS9_SECCOMP=enforce"})
	if err != nil || got.Profile != ProfileHardened || got.Seccomp != SeccompEnforce {
		t.Errorf("tightening a legacy pool: %+v %v", got, err)
	}
	enforcing := Security{Profile: ProfileHardened, Seccomp: SeccompEnforce, MountValidation: MountValidationEnforce}
	if _, err := Tighten(enforcing, []string{"LEVERS9_VOLUME_MOUNT_VALIDATION=log"}); !errdefs.IsPermissionDenied(err) {
		t.Errorf("log on a pool at enforce: %v", err)
	}
}

func TestSelectGPUs(t *testing.T) {
	inv := goldenHost().GPUs
	for _, tc := range []struct {
		req        string
		wantUUIDs  []string
		wantDriver bool
		wantErr    bool
	}{
		{"", nil, false, false},
		{"void", nil, false, false},
		{"none", nil, true, false},
		{"all", []string{"GPU-aaaa", "GPU-bbbb"}, true, false},
		{"1", []string{"GPU-bbbb"}, true, false},
		{"GPU-aaaa,1,0", []string{"GPU-aaaa", "GPU-bbbb"}, true, false},
		{"2", nil, false, true},
		{"GPU-zzzz", nil, false, true},
	} {
		gpus, driver, err := selectGPUs(tc.req, inv)
		var uuids []string
		for _, g := range gpus {
			uuids = append(uuids, g.UUID)
		}
		if (err != nil) != tc.wantErr || driver != tc.wantDriver || !slices.Equal(uuids, tc.wantUUIDs) {
			t.Errorf("%q: %v %v %v", tc.req, uuids, driver, err)
		}
	}
	if _, _, err := selectGPUs("all", GPUInventory{}); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("all without GPUs: %v", err)
	}
}

func TestDetectHost(t *testing.T) {
	h, err := DetectHost(t.Context(), NVIDIADiscovery{Root: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if h.Arch != runtime.GOARCH || h.Kernel.Kernel < 3 || h.CPUs < 1 || h.NofileHard == 0 {
		t.Errorf("host %+v", h)
	}
	_, statErr := os.Stat("/sys/module/apparmor/parameters/enabled")
	if os.IsNotExist(statErr) && (h.AppArmorEnabled || len(h.AppArmorProfiles) > 0) {
		t.Errorf("AppArmor reported on a kernel without it: %+v", h)
	}
	if len(h.GPUs.GPUs) != 0 {
		t.Errorf("GPUs on a host without the driver: %+v", h.GPUs)
	}
	// Whatever the node, a hardened spec for it must be buildable and
	// never ask AppArmor of a node that lacks it.
	s, _, err := BuildSpec(goldenTask(), Security{Profile: ProfileHardened, Seccomp: SeccompEnforce, Runtime: RuntimeRunc}, h)
	if err != nil {
		t.Fatal(err)
	}
	if !h.AppArmorEnabled && s.Process.ApparmorProfile != "" {
		t.Errorf("AppArmor profile %q on a node without AppArmor", s.Process.ApparmorProfile)
	}
}

func FuzzTighten(f *testing.F) {
	f.Add("hardened", "log", "LEVERS9_SECCOMP=enforce")
	f.Add("legacy", "off", "LEVERS9_SECURITY_PROFILE=hardened")
	f.Add("hardened", "enforce", "LEVERS9_SECCOMP=off")
	f.Fuzz(func(t *testing.T, prof, sc, kv string) {
		pool := Security{Profile: Profile(prof), Seccomp: SeccompMode(sc), Runtime: RuntimeRunc}
		if pool.Validate() != nil {
			return
		}
		got, err := Tighten(pool, []string{kv})
		if err != nil {
			if got != pool {
				t.Fatalf("error but settings changed: %+v", got)
			}
			return
		}
		if profileRank[got.Profile] < profileRank[pool.Profile] || seccompRank[got.Seccomp] < seccompRank[pool.Seccomp] {
			t.Fatalf("%q loosened %+v to %+v", kv, pool, got)
		}
		if got.Validate() != nil {
			t.Fatalf("%q produced invalid %+v", kv, got)
		}
	})
}

func FuzzParseGPUInformation(f *testing.F) {
	f.Add("Model: A100\nGPU UUID: GPU-1\nDevice Minor: 0\n")
	f.Add("Device Minor: x\n")
	f.Fuzz(func(t *testing.T, content string) {
		p := filepath.Join(t.TempDir(), "information")
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		info, err := parseGPUInformation(p)
		if err == nil && (info.uuid == "" || info.minor < 0) {
			t.Fatalf("accepted %q as %+v", content, info)
		}
	})
}

// TestAgentMountNoExec: an agent mount asking for noexec gets it, besides
// the nosuid,nodev every bind mount has; others do not.
func TestAgentMountNoExec(t *testing.T) {
	task := TaskSpec{AgentMounts: []Mount{
		{Source: "/state/io/t.1", Destination: "/run/levers9/io", NoExec: true},
		{Source: "/state/resolv.conf", Destination: "/etc/resolv.conf", ReadOnly: true},
	}}
	got := map[string][]string{}
	for _, m := range mountsFor(task, true, false) {
		got[m.Destination] = m.Options
	}
	if o := got["/run/levers9/io"]; !slices.Contains(o, "noexec") || !slices.Contains(o, "nosuid") || !slices.Contains(o, "nodev") || slices.Contains(o, "ro") {
		t.Errorf("io mount options %v, want rw with noexec,nosuid,nodev", o)
	}
	if o := got["/etc/resolv.conf"]; slices.Contains(o, "noexec") || !slices.Contains(o, "ro") {
		t.Errorf("resolv.conf options %v", o)
	}
}
