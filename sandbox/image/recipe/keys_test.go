package recipe

import (
	"regexp"
	"strings"
	"testing"
)

var (
	digestA = "sha256:" + strings.Repeat("a", 64)
	digestB = "sha256:" + strings.Repeat("b", 64)
	blob1   = "sha256:" + strings.Repeat("1", 64)
	blob2   = "sha256:" + strings.Repeat("2", 64)
)

// fourSteps is a valid recipe of four steps, the third a copy.
func fourSteps() *Recipe {
	return &Recipe{Base: "busybox", Steps: []Step{
		{Env: map[string]string{"A": "1"}},
		{Run: "mkdir /app"},
		{Copy: &Copy{Src: "./src", Dst: "/app", Blob: blob1}},
		{Apt: []string{"curl"}},
	}, Entrypoint: []string{"/app/run"}}
}

func mustKeys(t *testing.T, r *Recipe, base string) []string {
	t.Helper()
	k, err := StepKeys(r, base)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestStepKeys(t *testing.T) {
	t.Parallel()
	base := mustKeys(t, fourSteps(), digestA)
	keyRE := regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)
	if len(base) != 4 {
		t.Fatalf("%d keys, want 4", len(base))
	}
	for i, k := range base {
		if !keyRE.MatchString(k) {
			t.Fatalf("key[%d] = %q", i, k)
		}
	}
	tests := []struct {
		name    string
		mut     func(r *Recipe)
		base    string
		changed []bool // per key: whether it differs from base
	}{
		{"same recipe", func(*Recipe) {}, digestA, []bool{false, false, false, false}},
		{"change step 3 of 4", func(r *Recipe) { r.Steps[2].Copy.Dst = "/srv" }, digestA, []bool{false, false, true, true}},
		{"change step 4 of 4", func(r *Recipe) { r.Steps[3].Apt = []string{"wget"} }, digestA, []bool{false, false, false, true}},
		{"change step 1", func(r *Recipe) { r.Steps[0].Env["A"] = "2" }, digestA, []bool{true, true, true, true}},
		{"copy blob", func(r *Recipe) { r.Steps[2].Copy.Blob = blob2 }, digestA, []bool{false, false, true, true}},
		{"copy src only", func(r *Recipe) { r.Steps[2].Copy.Src = "/elsewhere/src" }, digestA, []bool{false, false, false, false}},
		{"base name only", func(r *Recipe) { r.Base = "reg:5000/busybox:1" }, digestA, []bool{false, false, false, false}},
		{"apt rendered equals run", func(r *Recipe) { r.Steps[3] = Step{Run: r.Rendered()[3].Run} }, digestA, []bool{false, false, false, false}},
		{"user is not a step", func(r *Recipe) { r.User = "nobody" }, digestA, []bool{false, false, false, false}},
		{"base digest", func(*Recipe) {}, digestB, []bool{true, true, true, true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := fourSteps()
			tt.mut(r)
			got := mustKeys(t, r, tt.base)
			for i := range got {
				if (got[i] != base[i]) != tt.changed[i] {
					t.Errorf("key[%d] changed = %v, want %v", i, got[i] != base[i], tt.changed[i])
				}
			}
		})
	}
}

func TestStepKeysErrors(t *testing.T) {
	t.Parallel()
	noBlob := fourSteps()
	noBlob.Steps[2].Copy.Blob = ""
	invalid := fourSteps()
	invalid.Steps[1].Run = "a\x00"
	tests := []struct {
		name string
		r    *Recipe
		base string
		want string
	}{
		{"digest without algorithm", fourSteps(), strings.Repeat("a", 64), "base digest"},
		{"short digest", fourSteps(), "sha256:abc", "base digest"},
		{"upper-case digest", fourSteps(), "sha256:" + strings.Repeat("A", 64), "base digest"},
		{"tag for digest", fourSteps(), "busybox:latest", "base digest"},
		{"copy without blob", noBlob, digestA, "steps[2].copy: no blob"},
		{"invalid recipe", invalid, digestA, "steps[1].run"},
		{"nil", nil, digestA, "nil recipe"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := StepKeys(tt.r, tt.base)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("StepKeys: %v, want an error containing %q", err, tt.want)
			}
			if _, err := Hash(tt.r, tt.base); err == nil {
				t.Fatal("Hash: no error")
			}
		})
	}
}

func TestStepKeysFrozen(t *testing.T) {
	t.Parallel()
	// The derivation is part of the cache's identity: if this fails,
	// change keySeedPrefix, then update the expected values.
	r := &Recipe{Base: "busybox", Steps: []Step{{Run: "true"}}}
	keys := mustKeys(t, r, digestA)
	h, err := Hash(r, digestA)
	if err != nil {
		t.Fatal(err)
	}
	if keys[0] != frozenKey0 || h != frozenHash {
		t.Fatalf("key derivation changed: key[0]=%s hash=%s", keys[0], h)
	}
}

func TestHash(t *testing.T) {
	t.Parallel()
	h0, err := Hash(fourSteps(), digestA)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		mut     func(r *Recipe)
		base    string
		changed bool
	}{
		{"same", func(*Recipe) {}, digestA, false},
		{"src only", func(r *Recipe) { r.Steps[2].Copy.Src = "other" }, digestA, false},
		{"empty cmd list", func(r *Recipe) { r.Cmd = []string{} }, digestA, false},
		{"user", func(r *Recipe) { r.User = "nobody" }, digestA, true},
		{"entrypoint", func(r *Recipe) { r.Entrypoint = []string{"/app/run", "-v"} }, digestA, true},
		{"entrypoint vs cmd", func(r *Recipe) { r.Entrypoint, r.Cmd = nil, r.Entrypoint }, digestA, true},
		{"last step", func(r *Recipe) { r.Steps[3].Apt = []string{"wget"} }, digestA, true},
		{"base digest", func(*Recipe) {}, digestB, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := fourSteps()
			tt.mut(r)
			h, err := Hash(r, tt.base)
			if err != nil {
				t.Fatal(err)
			}
			if (h != h0) != tt.changed {
				t.Fatalf("hash changed = %v, want %v", h != h0, tt.changed)
			}
		})
	}

	// No steps: the hash still depends on the base digest.
	ha, _ := Hash(&Recipe{Base: "x"}, digestA)
	hb, _ := Hash(&Recipe{Base: "x"}, digestB)
	if ha == "" || ha == hb {
		t.Fatalf("hash without steps: %q %q", ha, hb)
	}
}

func TestHashStableAcrossMarshal(t *testing.T) {
	t.Parallel()
	r := fourSteps()
	h1, err := Hash(r, digestA)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	back, err := Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	h2, err := Hash(back, digestA)
	if err != nil {
		t.Fatal(err)
	}
	if h1 != h2 {
		t.Fatalf("hash %s became %s across Marshal/Parse of %s", h1, h2, b)
	}
}

// Computed independently: seed = sha256(b"levers9-recipe-v1" + base),
// key0 = sha256(seed + b'{"run":"true"}'),
// hash = sha256(key0 + b'{"user":"","entrypoint":null,"cmd":null}').
const (
	frozenKey0 = "sha256:ab088d34da37d5be21325dd95f66186ed81cfaf813244894771586c83bdfb04b"
	frozenHash = "sha256:5db5430990b7cc022ec860eded475c32b7fb7fe6b56ffab21c501d81df321859"
)

// TestTags: the tags are valid registry tags (at most 128 of
// [A-Za-z0-9_.-]) for every key and hash, and a step's tag differs from an
// image's even for equal hex.
func TestTags(t *testing.T) {
	r := &Recipe{Base: "debian:bookworm-slim", Steps: []Step{{Run: "true"}}}
	const base = "sha256:0000000000000000000000000000000000000000000000000000000000000001"
	keys, err := StepKeys(r, base)
	if err != nil {
		t.Fatal(err)
	}
	hash, err := Hash(r, base)
	if err != nil {
		t.Fatal(err)
	}
	tagRE := regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$`)
	for _, tag := range []string{StepTag(keys[0]), ImageTag(hash)} {
		if !tagRE.MatchString(tag) {
			t.Errorf("%q is not a registry tag", tag)
		}
	}
	if StepTag(hash) == ImageTag(hash) {
		t.Error("a step's tag equals an image's")
	}
}
