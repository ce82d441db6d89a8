package sandbox

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// TestEffectiveFromSpec: what is reported is read from the spec, whatever
// was asked. Each case edits a hardened runc spec the way a runtime or a
// node would see it and checks the one thing that must follow.
func TestEffectiveFromSpec(t *testing.T) {
	base := func(t *testing.T, rt RuntimeName) *specs.Spec {
		t.Helper()
		h := goldenHost()
		h.AppArmorEnabled, h.AppArmorProfiles = true, []string{AppArmorProfileName}
		s, _, err := BuildSpec(goldenTask(), Security{Profile: ProfileHardened, Seccomp: SeccompEnforce, DropNetRaw: true, Runtime: rt}, h)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	loaded := goldenHost()
	loaded.AppArmorEnabled, loaded.AppArmorProfiles = true, []string{AppArmorProfileName}
	for _, tc := range []struct {
		name    string
		rt      RuntimeName
		profile Profile
		host    Host
		edit    func(s *specs.Spec)
		check   func(t *testing.T, s *specs.Spec, e Effective)
	}{
		{name: "seccomp enforce and its hash", rt: RuntimeRunc, host: loaded, check: func(t *testing.T, s *specs.Spec, e Effective) {
			b, _ := json.Marshal(s.Linux.Seccomp)
			sum := sha256.Sum256(b)
			if e.Seccomp != SeccompEnforce || e.SeccompSHA256 != hex.EncodeToString(sum[:]) {
				t.Errorf("seccomp %s %s", e.Seccomp, e.SeccompSHA256)
			}
		}},
		{name: "log default action is log", rt: RuntimeRunc, host: loaded,
			edit: func(s *specs.Spec) { s.Linux.Seccomp.DefaultAction = specs.ActLog },
			check: func(t *testing.T, _ *specs.Spec, e Effective) {
				if e.Seccomp != SeccompLog || e.SeccompSHA256 == "" {
					t.Errorf("seccomp %s %q", e.Seccomp, e.SeccompSHA256)
				}
			}},
		{name: "no profile in the spec is off, whatever was asked", rt: RuntimeRunc, host: loaded,
			edit: func(s *specs.Spec) { s.Linux.Seccomp = nil },
			check: func(t *testing.T, _ *specs.Spec, e Effective) {
				if e.Seccomp != SeccompOff || e.SeccompSHA256 != "" {
					t.Errorf("seccomp %s %q", e.Seccomp, e.SeccompSHA256)
				}
			}},
		{name: "NET_RAW in the bounding set is kept", rt: RuntimeRunc, host: loaded,
			edit: func(s *specs.Spec) {
				s.Process.Capabilities.Bounding = append(s.Process.Capabilities.Bounding, "CAP_NET_RAW")
			},
			check: func(t *testing.T, _ *specs.Spec, e Effective) {
				if e.DropNetRaw || !slices.Contains(e.Capabilities, "CAP_NET_RAW") {
					t.Errorf("dropNetRaw %v caps %v", e.DropNetRaw, e.Capabilities)
				}
			}},
		{name: "capabilities are the bounding set", rt: RuntimeRunc, host: loaded,
			edit: func(s *specs.Spec) { s.Process.Capabilities.Bounding = []string{"CAP_KILL"} },
			check: func(t *testing.T, _ *specs.Spec, e Effective) {
				if !slices.Equal(e.Capabilities, []string{"CAP_KILL"}) || !e.DropNetRaw {
					t.Errorf("caps %v", e.Capabilities)
				}
			}},
		{name: "no capabilities at all", rt: RuntimeRunc, host: loaded,
			edit: func(s *specs.Spec) { s.Process.Capabilities = nil },
			check: func(t *testing.T, _ *specs.Spec, e Effective) {
				if e.Capabilities == nil || len(e.Capabilities) != 0 || !e.DropNetRaw {
					t.Errorf("caps %#v", e.Capabilities)
				}
			}},
		{name: "masked and read-only paths listed under runc", rt: RuntimeRunc, host: loaded, check: func(t *testing.T, s *specs.Spec, e Effective) {
			if !slices.Equal(e.Masked, s.Linux.MaskedPaths) || !slices.Contains(e.Masked, "/proc/kcore") ||
				!slices.Equal(e.Readonly, s.Linux.ReadonlyPaths) || !e.MaskedPaths || !e.ReadonlyPaths || e.PathsNote != "" {
				t.Errorf("masked %v readonly %v note %q", e.Masked, e.Readonly, e.PathsNote)
			}
		}},
		{name: "paths not applicable under runsc", rt: RuntimeRunsc, host: loaded, check: func(t *testing.T, _ *specs.Spec, e Effective) {
			if len(e.Masked)+len(e.Readonly) != 0 || e.MaskedPaths || e.ReadonlyPaths || e.PathsNote != PathsNotApplicableRunsc {
				t.Errorf("masked %v readonly %v note %q", e.Masked, e.Readonly, e.PathsNote)
			}
		}},
		{name: "AppArmor applied where loaded", rt: RuntimeRunc, host: loaded, check: func(t *testing.T, _ *specs.Spec, e Effective) {
			if e.AppArmorProfile != AppArmorProfileName || e.AppArmorNote != "" {
				t.Errorf("apparmor %q %q", e.AppArmorProfile, e.AppArmorNote)
			}
		}},
		{name: "AppArmor in the spec but not on the node", rt: RuntimeRunc, host: goldenHost(), check: func(t *testing.T, _ *specs.Spec, e Effective) {
			if e.AppArmorProfile != "" || e.AppArmorNote != AppArmorNotLoaded {
				t.Errorf("apparmor %q %q", e.AppArmorProfile, e.AppArmorNote)
			}
		}},
		{name: "AppArmor ignored by runsc", rt: RuntimeRunsc, host: loaded, check: func(t *testing.T, _ *specs.Spec, e Effective) {
			if e.AppArmorProfile != "" || e.AppArmorNote != AppArmorIgnoredRunsc {
				t.Errorf("apparmor %q %q", e.AppArmorProfile, e.AppArmorNote)
			}
		}},
		{name: "legacy asks for no AppArmor", rt: RuntimeRunc, profile: ProfileLegacy, host: loaded,
			edit: func(s *specs.Spec) { s.Process.ApparmorProfile = "" },
			check: func(t *testing.T, _ *specs.Spec, e Effective) {
				if e.AppArmorProfile != "" || e.AppArmorNote != AppArmorNotAsked {
					t.Errorf("apparmor %q %q", e.AppArmorProfile, e.AppArmorNote)
				}
			}},
		{name: "noNewPrivileges as the spec says", rt: RuntimeRunc, host: loaded,
			edit: func(s *specs.Spec) { s.Process.NoNewPrivileges = false },
			check: func(t *testing.T, _ *specs.Spec, e Effective) {
				if e.NoNewPrivileges {
					t.Error("noNewPrivileges claimed")
				}
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := base(t, tc.rt)
			if tc.edit != nil {
				tc.edit(s)
			}
			prof := tc.profile
			if prof == "" {
				prof = ProfileHardened
			}
			e, err := effectiveOf(s, tc.rt, prof, tc.host)
			if err != nil {
				t.Fatal(err)
			}
			if e.Runtime != tc.rt || e.Profile != prof {
				t.Errorf("runtime %s profile %s", e.Runtime, e.Profile)
			}
			tc.check(t, s, e)
		})
	}
	if _, err := effectiveOf(&specs.Spec{}, RuntimeRunc, ProfileHardened, goldenHost()); err == nil {
		t.Error("a spec without process or linux gave no error")
	}
}

// TestEffectiveHashMatchesBundle: the hash is the one of the bytes
// writeBundle really writes for linux.seccomp.
func TestEffectiveHashMatchesBundle(t *testing.T) {
	s, eff, err := BuildSpec(goldenTask(), Security{Profile: ProfileHardened, Seccomp: SeccompEnforce, DropNetRaw: true, Runtime: RuntimeRunc}, goldenHost())
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := writeBundle(dir, s); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var raw struct {
		Linux struct {
			Seccomp json.RawMessage `json:"seccomp"`
		} `json:"linux"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(raw.Linux.Seccomp)
	if got := hex.EncodeToString(sum[:]); got != eff.SeccompSHA256 {
		t.Errorf("bundle's seccomp sha256 %s, effective says %s", got, eff.SeccompSHA256)
	}
}

func TestAppArmorProfileKey(t *testing.T) {
	for _, tc := range []struct {
		name, profile, wantErr string
	}{
		{"default", "", ""},
		{"custom", "my-profile_1.2", ""},
		{"path", "/etc/apparmor.d/x", "worker.containerSecurity.apparmorProfile"},
		{"space", "a b", "worker.containerSecurity.apparmorProfile"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sec := Security{AppArmorProfile: tc.profile}.WithDefaults()
			if tc.profile == "" && sec.AppArmorProfile != AppArmorProfileName {
				t.Errorf("default %q", sec.AppArmorProfile)
			}
			sec.AppArmorProfile = tc.profile
			err := sec.Validate()
			if (err != nil) != (tc.wantErr != "") || (err != nil && !strings.Contains(err.Error(), tc.wantErr)) {
				t.Errorf("Validate: %v, want %q", err, tc.wantErr)
			}
		})
	}
	h := goldenHost()
	h.AppArmorEnabled, h.AppArmorProfiles = true, []string{"custom"}
	s, eff, err := BuildSpec(goldenTask(), Security{Profile: ProfileHardened, Seccomp: SeccompOff, Runtime: RuntimeRunc, AppArmorProfile: "custom"}, h)
	if err != nil {
		t.Fatal(err)
	}
	if s.Process.ApparmorProfile != "custom" || eff.AppArmorProfile != "custom" {
		t.Errorf("spec %q effective %q, want custom", s.Process.ApparmorProfile, eff.AppArmorProfile)
	}
}

// TestLoadAppArmorSkipsWithout: a node without AppArmor loads nothing
// (and needs no parser); the embedded profile names itself.
func TestLoadAppArmorSkipsWithout(t *testing.T) {
	h := goldenHost()
	got, err := LoadAppArmor(t.Context(), h, "/nonexistent/apparmor_parser")
	if err != nil || len(got.AppArmorProfiles) != 0 {
		t.Fatalf("no AppArmor: %v %v", got.AppArmorProfiles, err)
	}
	h.AppArmorEnabled = true
	if _, err := LoadAppArmor(t.Context(), h, "/nonexistent/apparmor_parser"); err == nil {
		t.Error("enabled without a parser: no error")
	}
	if !strings.Contains(string(AppArmorProfileText), "profile "+AppArmorProfileName+" ") {
		t.Error("embedded profile does not declare " + AppArmorProfileName)
	}
}
