package image_test

import (
	"strings"
	"testing"

	"github.com/levers9/levers9/internal/errdefs"
	"github.com/levers9/levers9/sandbox/image"
)

func TestConfigValidateNamesEveryField(t *testing.T) {
	t.Parallel()
	cfg := image.Config{
		Root:               "relative/dir",
		Registry:           "",
		Registries:         []string{"ok.example:5000", "bad registry"},
		InsecureRegistries: []string{"other.example:5000"},
		DiskBudget:         -1,
		MountSource:        "has space",
		MaxUnpackedSize:    -1,
	}
	err := cfg.Validate()
	if err == nil {
		t.Fatal("Validate accepted a bad config")
	}
	for _, field := range []string{
		"image.Root", "image.Registry:", "image.Registries[1]", "image.InsecureRegistries[0]",
		"image.DiskBudget", "image.MountSource", "image.MaxUnpackedSize",
	} {
		if !strings.Contains(err.Error(), field) {
			t.Errorf("Validate error does not name %s:\n%v", field, err)
		}
	}
	if _, err := image.New(cfg); !errdefs.IsInvalidArgument(err) {
		t.Errorf("New(bad config) = %v, want invalid argument", err)
	}
	good := image.Config{Root: t.TempDir(), Registry: "127.0.0.1:5000", InsecureRegistries: []string{"127.0.0.1:5000"}}
	if err := good.Validate(); err != nil {
		t.Errorf("Validate(good) = %v", err)
	}
}
