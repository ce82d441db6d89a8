package recipe

import (
	"reflect"
	"strings"
	"testing"
)

const goodYAML = `# a recipe with every step kind
base: debian:bookworm-slim
steps:
  - apt: [curl, ca-certificates]
  - pip: [numpy, "torch==2.3.0"]
  - env:
      PATH: /usr/local/bin:/usr/bin:/bin
      APP_MODE: prod
  - workdir: /app
  - copy: {src: ./src, dst: /app}
  - run: |
      echo "hello" > /app/hello.txt
user: "1000:1000"
entrypoint: [python3, -m, app]
cmd: [--port, "8080"]
`

var goodRecipe = &Recipe{
	Base: "debian:bookworm-slim",
	Steps: []Step{
		{Apt: []string{"curl", "ca-certificates"}},
		{Pip: []string{"numpy", "torch==2.3.0"}},
		{Env: map[string]string{"PATH": "/usr/local/bin:/usr/bin:/bin", "APP_MODE": "prod"}},
		{Workdir: "/app"},
		{Copy: &Copy{Src: "./src", Dst: "/app"}},
		{Run: "echo \"hello\" > /app/hello.txt\n"},
	},
	User:       "1000:1000",
	Entrypoint: []string{"python3", "-m", "app"},
	Cmd:        []string{"--port", "8080"},
}

func TestParseGood(t *testing.T) {
	t.Parallel()
	r, err := Parse([]byte(goodYAML))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(r, goodRecipe) {
		t.Fatalf("Parse:\n got %#v\nwant %#v", r, goodRecipe)
	}
	if err := r.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
}

func TestParseErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		in   string
		want []string // substrings of the error
	}{
		{"unknown top field", "base: x\nimage: y\n", []string{"line 2", `unknown field "image"`}},
		{"unknown step field", "base: x\nsteps:\n  - run: a\n  - rnu: b\n", []string{"line 4", "steps[1]", `unknown field "rnu"`}},
		{"unknown copy field", "base: x\nsteps:\n  - copy:\n      src: a\n      dst: /b\n      mode: 0644\n", []string{"line 6", "steps[0].copy", `unknown field "mode"`}},
		{"all unknown fields at once", "base: x\nfoo: 1\nbar: 2\n", []string{`"foo"`, `"bar"`, "line 3"}},
		{"repeated field", "base: x\nbase: y\n", []string{"line 2", `"base" given twice`}},
		{"repeated env key", "base: x\nsteps:\n  - env: {A: 1, A: 2}\n", []string{"steps[0].env", `"A" given twice`}},
		{"wrong type", "base: x\nsteps:\n  - run: [a, b]\n", []string{"line 3"}},
		{"not a mapping", "- a\n- b\n", []string{"want a mapping"}},
		{"empty", "", []string{"empty"}},
		{"comment only", "# nothing\n", []string{"empty"}},
		{"scalar", "hello\n", []string{"want a mapping"}},
		{"two documents", "base: x\n---\nbase: y\n", []string{"second YAML document"}},
		{"anchors", "base: &b x\nuser: *b\n", []string{"anchors and aliases"}},
		{"bad syntax", "base: [x\n", []string{"recipe:"}},
		{"unknown field in JSON", `{"base": "x", "steps": [{"run": "a", "extra": 1}]}`, []string{"line 1", `unknown field "extra"`}},
		{"too large", "base: x\n#" + strings.Repeat("x", MaxRecipeBytes) + "\n", []string{"at most"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := Parse([]byte(tt.in))
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestParseNormalizesEmpty(t *testing.T) {
	t.Parallel()
	r, err := Parse([]byte("base: x\nsteps: []\nentrypoint: []\ncmd: []\n"))
	if err != nil {
		t.Fatal(err)
	}
	if want := (&Recipe{Base: "x"}); !reflect.DeepEqual(r, want) {
		t.Fatalf("got %#v, want %#v", r, want)
	}
}

func TestParseJSONBlob(t *testing.T) {
	t.Parallel()
	blob := "sha256:" + strings.Repeat("ab", 32)
	r, err := Parse([]byte(`{"base":"x","steps":[{"copy":{"src":"a","dst":"/b","blob":"` + blob + `"}}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if got := r.Steps[0].Copy.Blob; got != blob {
		t.Fatalf("blob = %q", got)
	}
}

func TestValidate(t *testing.T) {
	t.Parallel()
	ok := func(mut func(r *Recipe)) *Recipe {
		r := goodRecipe.Clone()
		mut(r)
		return r
	}
	step := func(s Step) *Recipe { return &Recipe{Base: "busybox", Steps: []Step{{Run: "true"}, {Run: "true"}, s}} }
	many := make([]Step, MaxSteps+1)
	for i := range many {
		many[i] = Step{Run: "true"}
	}
	tests := []struct {
		name string
		r    *Recipe
		want []string // empty: valid
	}{
		{"good", goodRecipe, nil},
		{"base only", &Recipe{Base: "busybox"}, nil},
		{"base with registry and digest", &Recipe{Base: "reg:5000/x/y@sha256:" + strings.Repeat("0", 64)}, nil},
		{"no base", &Recipe{}, []string{"base: required"}},
		{"bad base", &Recipe{Base: "Debian:Bookworm!"}, []string{"base:", "not an image reference"}},
		{"base with bad digest", &Recipe{Base: "x@sha256:12"}, []string{"base:"}},
		{"too many steps", &Recipe{Base: "x", Steps: many}, []string{"steps: 129 steps, at most 128"}},
		{"max steps", &Recipe{Base: "x", Steps: many[:MaxSteps]}, nil},
		{"empty step", step(Step{}), []string{"steps[2]: empty step"}},
		{"two fields", step(Step{Run: "a", Workdir: "/a"}), []string{"steps[2]: sets run and workdir"}},
		{"empty env is empty", step(Step{Env: map[string]string{}}), []string{"steps[2]: empty step"}},
		{"run with NUL", step(Step{Run: "a\x00b"}), []string{"steps[2].run: contains a NUL"}},
		{"run not UTF-8", step(Step{Run: "a\xffb"}), []string{"steps[2].run: is not valid UTF-8"}},
		{"env bad key", step(Step{Env: map[string]string{"1A": "x", "A-B": "y"}}), []string{`steps[2].env["1A"]`, `steps[2].env["A-B"]`}},
		{"env reserved", step(Step{Env: map[string]string{"LEVERS9_TOKEN": "x"}}), []string{"steps[2].env[LEVERS9_TOKEN]: LEVERS9_* variables are reserved"}},
		{"env reserved lower case", step(Step{Env: map[string]string{"levers9_x": "x"}}), []string{"reserved"}},
		{"env NUL value", step(Step{Env: map[string]string{"A": "a\x00"}}), []string{`steps[2].env["A"]: value contains a NUL`}},
		{"env ok", step(Step{Env: map[string]string{"_a1": "", "B": "x=y"}}), nil},
		{"workdir relative", step(Step{Workdir: "app"}), []string{"steps[2].workdir: \"app\" is not absolute"}},
		{"workdir dotdot", step(Step{Workdir: "/a/../b"}), []string{"steps[2].workdir:", "has a .. component"}},
		{"workdir unclean", step(Step{Workdir: "/a//b/"}), []string{"steps[2].workdir:", "not clean"}},
		{"workdir proc", step(Step{Workdir: "/proc/self"}), []string{"steps[2].workdir:", "under /proc"}},
		{"workdir sys", step(Step{Workdir: "/sys"}), []string{"under /sys"}},
		{"workdir devices is fine", step(Step{Workdir: "/devices"}), nil},
		{"copy dst dev", step(Step{Copy: &Copy{Src: "a", Dst: "/dev/shm"}}), []string{"steps[2].copy.dst:", "under /dev"}},
		{"copy dst relative", step(Step{Copy: &Copy{Src: "a", Dst: "b"}}), []string{"steps[2].copy.dst:", "not absolute"}},
		{"copy no src no dst", step(Step{Copy: &Copy{}}), []string{"steps[2].copy.src: required", "steps[2].copy.dst: required"}},
		{"copy bad blob", step(Step{Copy: &Copy{Src: "a", Dst: "/b", Blob: "sha256:XYZ"}}), []string{"steps[2].copy.blob"}},
		{"copy good blob", step(Step{Copy: &Copy{Src: "a", Dst: "/", Blob: "sha256:" + strings.Repeat("f", 64)}}), nil},
		{"apt ok", step(Step{Apt: []string{"libc6:amd64", "g++", "python3.11", "curl=7.88.1-10+deb12u5"}}), nil},
		{"apt shell", step(Step{Apt: []string{"curl", "x; rm -rf /", "$(id)", "a b", "Upper", "-y"}}), []string{"steps[2].apt[1]", "steps[2].apt[2]", "steps[2].apt[3]", "steps[2].apt[4]", "steps[2].apt[5]"}},
		{"pip ok", step(Step{Pip: []string{"torch==2.3.0", "Django", "typing_extensions", "requests~=2.31"}}), nil},
		{"pip shell", step(Step{Pip: []string{"numpy>=1", "a[b]", "x`id`", "-e .", "--index-url=x"}}), []string{"steps[2].pip[0]", "steps[2].pip[1]", "steps[2].pip[2]", "steps[2].pip[3]", "steps[2].pip[4]"}},
		{"user name", ok(func(r *Recipe) { r.User = "app_user-1" }), nil},
		{"user uid", ok(func(r *Recipe) { r.User = "0" }), nil},
		{"user bad", ok(func(r *Recipe) { r.User = "Root" }), []string{"user:"}},
		{"user uid:name", ok(func(r *Recipe) { r.User = "1000:staff" }), []string{"user:"}},
		{"user leading zero", ok(func(r *Recipe) { r.User = "01" }), []string{"user:"}},
		{"user too big", ok(func(r *Recipe) { r.User = "4294967295" }), []string{"user:"}},
		{"entrypoint NUL", ok(func(r *Recipe) { r.Entrypoint = []string{"a", "b\x00"} }), []string{"entrypoint[1]: contains a NUL"}},
		{"cmd NUL", ok(func(r *Recipe) { r.Cmd = []string{"\x00"} }), []string{"cmd[0]"}},
		{"every problem at once", &Recipe{Steps: []Step{{}, {Workdir: "x"}}, User: "?"}, []string{"base: required", "steps[0]", "steps[1]", "user:"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := tt.r.Validate()
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("Validate: no error")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
			// Each problem is its own joined error.
			if j, ok := err.(interface{ Unwrap() []error }); !ok || len(j.Unwrap()) < 1 {
				t.Errorf("error is not from errors.Join: %T", err)
			}
		})
	}
	var nilRecipe *Recipe
	if err := nilRecipe.Validate(); err == nil {
		t.Error("nil recipe validated")
	}
}

func TestRendered(t *testing.T) {
	t.Parallel()
	r := &Recipe{Base: "x", Steps: []Step{
		{Apt: []string{"curl", "g++"}},
		{Pip: []string{"numpy", "torch==2.3.0"}},
		{Run: "make"},
		{Env: map[string]string{"A": "1"}},
		{Copy: &Copy{Src: "s", Dst: "/d", Blob: "b"}},
		{Apt: []string{"it's; evil"}}, // invalid, but still quoted
	}}
	want := []Step{
		{Run: "apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends curl g++ && rm -rf /var/lib/apt/lists/*"},
		{Run: "python3 -m pip install --no-cache-dir numpy torch==2.3.0"},
		{Run: "make"},
		{Env: map[string]string{"A": "1"}},
		{Copy: &Copy{Src: "s", Dst: "/d", Blob: "b"}},
		{Run: `apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends 'it'\''s; evil' && rm -rf /var/lib/apt/lists/*`},
	}
	got := r.Rendered()
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Rendered:\n got %#v\nwant %#v", got, want)
	}
	// A deep copy: changing it leaves r alone.
	got[3].Env["A"] = "2"
	got[4].Copy.Dst = "/other"
	if r.Steps[3].Env["A"] != "1" || r.Steps[4].Copy.Dst != "/d" {
		t.Fatal("Rendered shares memory with the recipe")
	}
}

func TestShellQuote(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"curl":   "curl",
		"a=1.2":  "a=1.2",
		"":       "''",
		"a b":    "'a b'",
		"it's":   `'it'\''s'`,
		"~x":     "'~x'",
		"$(id)":  "'$(id)'",
		"*":      "'*'",
		"a\nb":   "'a\nb'",
		"x;true": "'x;true'",
	} {
		if got := shellQuote(in); got != want {
			t.Errorf("shellQuote(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestMarshalRoundTrip(t *testing.T) {
	t.Parallel()
	withBlob := goodRecipe.Clone()
	withBlob.Steps[4].Copy.Blob = "sha256:" + strings.Repeat("1", 64)
	odd := &Recipe{Base: "x", Steps: []Step{
		{Run: "a && b < c > d & e \u0085 \u2028 \u007f \ufeff \x01 \t\n 'q' \"dq\" \\ é 日本 😀"},
		{Env: map[string]string{"Z": "1", "A": "\u009f"}},
	}, Entrypoint: []string{""}}
	for name, r := range map[string]*Recipe{"good": goodRecipe, "blob": withBlob, "odd": odd, "base only": {Base: "x"}} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b, err := Marshal(r)
			if err != nil {
				t.Fatal(err)
			}
			got, err := Parse(b)
			if err != nil {
				t.Fatalf("Parse(%s): %v", b, err)
			}
			if !reflect.DeepEqual(got, r) {
				t.Fatalf("round trip of %s:\n got %#v\nwant %#v", b, got, r)
			}
			b2, _ := Marshal(got)
			if string(b2) != string(b) {
				t.Fatalf("Marshal not stable:\n%s\n%s", b, b2)
			}
		})
	}
}

func TestMarshalCanonical(t *testing.T) {
	t.Parallel()
	r := &Recipe{Base: "x", Steps: []Step{
		{Env: map[string]string{"B": "2", "A": "1"}},
		{Run: "a && b"},
		{Copy: &Copy{Src: "s", Dst: "/d", Blob: "sha256:00"}},
	}, Entrypoint: []string{}}
	b, err := Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"base":"x","steps":[{"env":{"A":"1","B":"2"}},{"run":"a && b"},{"copy":{"src":"s","dst":"/d","blob":"sha256:00"}}]}`
	if string(b) != want {
		t.Fatalf("Marshal:\n got %s\nwant %s", b, want)
	}
	if _, err := Marshal(nil); err == nil {
		t.Fatal("Marshal(nil): no error")
	}
}

func TestParseDefaultBase(t *testing.T) {
	t.Parallel()
	for _, doc := range []string{"steps:\n  - run: true\n", "base: \"\"\nsteps:\n  - run: true\n", `{"steps": [{"run": "true"}]}`} {
		r, err := Parse([]byte(doc))
		if err != nil || r.Base != DefaultBase {
			t.Errorf("Parse(%q): base %q, %v; want %q", doc, r.Base, err, DefaultBase)
		}
	}
}
