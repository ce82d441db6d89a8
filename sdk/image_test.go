package sdk

import (
	"reflect"
	"strings"
	"testing"

	"github.com/levers9/levers9/sandbox/image/recipe"
)

func TestImageBuilderEqualsYAML(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		img  *ImageBuilder
		yaml string
	}{
		{"base only", NewImage("busybox"), "base: busybox\n"},
		{"every step", NewImage("debian:bookworm-slim").
			Apt("curl", "ca-certificates").
			Pip("numpy", "torch==2.3.0").
			Env("APP_MODE", "prod").Env("PORT", "8080").
			Workdir("/app").
			Copy("./src", "/app").
			Run("python3 -m compileall /app").
			Env("LATE", "1").
			User("1000:1000").
			Entrypoint("python3", "-m", "app").
			Cmd("--port", "8080"), `
base: debian:bookworm-slim
steps:
  - apt: [curl, ca-certificates]
  - pip: [numpy, torch==2.3.0]
  - env: {APP_MODE: prod, PORT: "8080"}
  - workdir: /app
  - copy: {src: ./src, dst: /app}
  - run: python3 -m compileall /app
  - env: {LATE: "1"}
user: "1000:1000"
entrypoint: [python3, -m, app]
cmd: [--port, "8080"]
`},
		{"empty entrypoint keeps the base's", NewImage("busybox").Entrypoint().Run("true"), "base: busybox\nsteps: [{run: \"true\"}]\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := tt.img.Recipe()
			if err != nil {
				t.Fatal(err)
			}
			want, err := recipe.Parse([]byte(tt.yaml))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("builder:\n got %#v\nwant %#v", got, want)
			}
		})
	}
}

func TestImageBuilderRecipeIsACopy(t *testing.T) {
	t.Parallel()
	img := NewImage("busybox").Env("A", "1").Entrypoint("/bin/sh")
	r1, err := img.Recipe()
	if err != nil {
		t.Fatal(err)
	}
	r1.Steps[0].Env["A"] = "changed"
	r1.Entrypoint[0] = "changed"
	img.Run("true")
	r2, err := img.Recipe()
	if err != nil {
		t.Fatal(err)
	}
	if r2.Steps[0].Env["A"] != "1" || r2.Entrypoint[0] != "/bin/sh" || len(r1.Steps) != 1 || len(r2.Steps) != 2 {
		t.Fatalf("recipes share memory: %#v %#v", r1, r2)
	}
}

func TestImageBuilderDefaultBase(t *testing.T) {
	t.Parallel()
	r, err := NewImage("").Run("true").Recipe()
	if err != nil || r.Base != recipe.DefaultBase {
		t.Fatalf("NewImage(\"\"): base %q, %v; want %q", r.Base, err, recipe.DefaultBase)
	}
}

func TestImageBuilderErrors(t *testing.T) {
	t.Parallel()
	_, err := NewImage("not a reference").
		Apt().
		Pip("numpy>=1").
		Env("LEVERS9_TOKEN", "x").
		Workdir("app").
		Copy("./src", "/proc/x").
		User("Root").
		Recipe()
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{"Apt: no packages", `base: "not a reference"`, "steps[0].pip[0]", "steps[1].env[LEVERS9_TOKEN]", "steps[2].workdir", "steps[3].copy.dst", "user:"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not contain %q", err, want)
		}
	}
}
