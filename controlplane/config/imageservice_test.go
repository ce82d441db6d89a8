package config

import (
	"strings"
	"testing"
)

func TestRegistryValues(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, yml string
		env       map[string]string
		wantErr   string // "" means valid
	}{
		{name: "unset", yml: ``},
		{name: "base host", yml: "imageService: {runner: {baseImageRegistry: registry.example.com}}"},
		{name: "base host:port prefix", yml: "imageService: {runner: {baseImageRegistry: 10.0.0.5:5000/levers9/base}}"},
		{name: "base localhost", yml: "imageService: {runner: {baseImageRegistry: localhost:5000}}"},
		{name: "base from env", env: map[string]string{"LEVERS9_IMAGESERVICE_RUNNER_BASEIMAGEREGISTRY": "ghcr.io/acme"}},
		{name: "base bad host", yml: "imageService: {runner: {baseImageRegistry: 'not a host'}}",
			wantErr: "imageService.runner.baseImageRegistry: \"not a host\" is not a registry"},
		{name: "base scheme", yml: "imageService: {runner: {baseImageRegistry: 'https://registry.example.com'}}",
			wantErr: "imageService.runner.baseImageRegistry:"},
		{name: "base upper-case path", yml: "imageService: {runner: {baseImageRegistry: registry.example.com/Levers9}}",
			wantErr: "imageService.runner.baseImageRegistry: \"registry.example.com/Levers9\" is not a registry host[:port] with a path prefix"},
		{name: "base trailing slash", yml: "imageService: {runner: {baseImageRegistry: registry.example.com/}}",
			wantErr: "imageService.runner.baseImageRegistry:"},
		{name: "base from env bad", env: map[string]string{"LEVERS9_IMAGESERVICE_RUNNER_BASEIMAGEREGISTRY": "a b"},
			wantErr: "imageService.runner.baseImageRegistry:"},
		{name: "worker host", yml: "worker: {imageRegistry: 127.0.0.1:5000}"},
		{name: "worker path refused", yml: "worker: {imageRegistry: registry.example.com/levers9}",
			wantErr: "worker.imageRegistry: \"registry.example.com/levers9\": give the registry host[:port] only"},
		{name: "worker bad host", yml: "worker: {imageRegistry: 'reg istry'}",
			wantErr: "worker.imageRegistry: \"reg istry\" is not a registry"},
		{name: "unknown key under imageService", yml: "imageService: {runner: {baseRegistry: x}}",
			wantErr: "field baseRegistry not found"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c, err := Load(strings.NewReader(tc.yml), envMap(tc.env))
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("want valid, got %v", err)
				}
				if v, ok := tc.env["LEVERS9_IMAGESERVICE_RUNNER_BASEIMAGEREGISTRY"]; ok && c.ImageService.Runner.BaseImageRegistry != v {
					t.Errorf("env override lost: %q", c.ImageService.Runner.BaseImageRegistry)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("error = %v, want it to contain %q", err, tc.wantErr)
			}
		})
	}
}
