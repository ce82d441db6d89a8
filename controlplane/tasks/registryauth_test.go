package tasks

import "testing"

// The host a login is looked up by is the one the agent's image cache
// resolves the reference to.
func TestImageRegistryHost(t *testing.T) {
	for _, tt := range []struct{ ref, def, want string }{
		{"reg.example:5000/team/app:v1", "127.0.0.1:5000", "reg.example:5000"},
		{"team/app:v1", "127.0.0.1:5000", "127.0.0.1:5000"},
		{"busybox", "", "index.docker.io"},
		{"docker.io/library/busybox@sha256:" + "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", "", "index.docker.io"},
	} {
		got, err := ImageRegistryHost(tt.ref, tt.def)
		if err != nil || got != tt.want {
			t.Errorf("ImageRegistryHost(%q, %q) = %q, %v; want %q", tt.ref, tt.def, got, err, tt.want)
		}
	}
	if _, err := ImageRegistryHost("Bad Ref", ""); err == nil {
		t.Error("a bad reference parsed")
	}
}
