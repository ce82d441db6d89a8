package egress

import (
	"strings"
	"testing"

	"github.com/levers9/levers9/internal/errdefs"
)

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	good := Config{Resolvers: []string{"192.0.2.53"}}.WithDefaults()
	if err := good.Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	bad := good
	bad.Prefix = "Bad-Prefix"
	bad.Security.Egress.Mode = "block"
	bad.Security.Egress.Allow = []string{"10.0.0.0/8", "10.0.0.0/33"}
	bad.SubnetV4 = "fd00::/64"
	bad.SubnetV6 = "10.0.0.0/8"
	bad.Resolvers = []string{"dns.example"}
	bad.Controlplane = []string{"cp:1995"}
	err := bad.Validate()
	if !errdefs.IsInvalidArgument(err) {
		t.Fatalf("err = %v, want invalid argument", err)
	}
	for _, want := range []string{
		"worker.network.prefix",
		`worker.containerSecurity.egress.mode: "block" is not observe or enforce`,
		`worker.containerSecurity.egress.allow[1]: "10.0.0.0/33": prefix length out of range`,
		"worker.network.subnetV4",
		"worker.network.subnetV6",
		"worker.network.resolvers[0]",
		`worker.network.controlplane[0]: "cp:1995"`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
	if err := (Config{}).WithDefaults().Validate(); err == nil || !strings.Contains(err.Error(), "worker.network.resolvers: at least one") {
		t.Errorf("missing resolvers: %v", err)
	}
}
