package egress

import (
	"flag"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite golden files in testdata")

func goldenPlan(t *testing.T, mode Mode, isolation bool) *plan {
	t.Helper()
	cfg := Config{
		Prefix: "lv9",
		Security: SecurityConfig{BridgePortIsolation: isolation, Egress: EgressConfig{Mode: mode,
			Allow: []string{"192.168.77.10:8080/tcp", "[fd12:3456::10]:8080", "10.20.0.0/16"}}},
		Resolvers:    []string{"192.0.2.53", "2001:db8::53"},
		Controlplane: []string{"10.250.0.5:1995"},
	}.WithDefaults()
	p, err := cfg.plan()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func goldenCtrs(p *plan) []ctrRules {
	return []ctrRules{
		{key: "0badcafe", addr: netip.MustParseAddr("10.209.0.3"), pol: p.policy},
		{key: "0badcafe", addr: netip.MustParseAddr("fd6c:7639:9000::3"), pol: p.policy},
		{key: "00c0ffee", addr: netip.MustParseAddr("10.209.0.2"), pol: p.policy},
		{key: "00c0ffee", addr: netip.MustParseAddr("fd6c:7639:9000::2"), pol: p.policy},
	}
}

func TestRulesGolden(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		mode      Mode
		isolation bool
	}{
		{"observe", ModeObserve, true},
		{"enforce", ModeEnforce, true},
		{"enforce-no-isolation", ModeEnforce, false},
		{"mixed", ModeObserve, true},
	} {
		for _, fam := range []family{v4, v6} {
			name := tc.name + "-" + fam.String() + ".golden"
			t.Run(name, func(t *testing.T) {
				p := goldenPlan(t, tc.mode, tc.isolation)
				ctrs := goldenCtrs(p)
				if tc.name == "observe" {
					// br_netfilter present: the port is matched too.
					for i := range ctrs {
						ctrs[i].veth = names{"lv9"}.hostVeth(ctrs[i].key)
					}
				}
				if tc.name == "mixed" {
					// A pool override: enforce, no isolation, its own allow list.
					pol, err := SecurityConfig{Egress: EgressConfig{Mode: ModeEnforce, Allow: []string{"172.16.5.0/24:443/tcp", "[fd99::/16]:443/tcp"}}}.parse("worker.pools.gpu.security")
					if err != nil {
						t.Fatal(err)
					}
					ctrs[0].pol, ctrs[1].pol = pol, pol
				}
				got := renderSave(buildRules(p, fam, ctrs), p.cfg.Prefix)
				path := filepath.Join("testdata", name)
				if *update {
					if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
						t.Fatal(err)
					}
				}
				b, err := os.ReadFile(path)
				if err != nil {
					t.Fatalf("%v (run with -update)", err)
				}
				if string(b) != got {
					t.Errorf("rules differ from %s (run with -update after checking):\n%s", path, got)
				}
			})
		}
	}
}

func TestRulesProperties(t *testing.T) {
	t.Parallel()
	p := goldenPlan(t, ModeEnforce, true)
	for _, fam := range []family{v4, v6} {
		rs := buildRules(p, fam, goldenCtrs(p))
		text := renderSave(rs, "lv9")
		// Every class rule names its class and is preceded by its log rule.
		for _, c := range rs.chains {
			for i, r := range c.rules {
				j := strings.Join(r, " ")
				if strings.Contains(j, "class=") && strings.Contains(j, "ctr=") {
					prev := strings.Join(c.rules[i-1], " ")
					if !strings.Contains(prev, "NFLOG") {
						t.Errorf("%s: class rule %q not preceded by NFLOG", fam, j)
					}
				}
			}
		}
		// Established first in the dispatch chains.
		if !strings.Contains(strings.Join(rs.chains[0].rules[0], " "), "ESTABLISHED") {
			t.Errorf("%s: first forward rule is not ESTABLISHED", fam)
		}
		// The same content gets the same names whatever the container order.
		rev := goldenCtrs(p)
		rev[0], rev[3] = rev[3], rev[0]
		if a, b := renderSave(buildRules(p, fam, goldenCtrs(p)), "lv9"), renderSave(buildRules(p, fam, rev), "lv9"); a != b {
			t.Errorf("%s: rules depend on container order", fam)
		}
		// A container's chain does not change when another joins, so
		// an apply keeps it (and its counters) as it is.
		one := buildRules(p, fam, goldenCtrs(p)[2:])
		if one.chains[3].name != rs.chains[3].name {
			t.Errorf("%s: chain of 00c0ffee renamed when 0badcafe joined: %s vs %s", fam, one.chains[3].name, rs.chains[3].name)
		}
		if one.hooks[0].target == rs.hooks[0].target {
			t.Errorf("%s: dispatch chain kept its name with different content", fam)
		}
		for _, c := range rs.chains {
			if len(c.name) > 28 {
				t.Errorf("%s: chain name %s longer than iptables allows", fam, c.name)
			}
		}
		if !strings.Contains(text, "metadata") {
			t.Errorf("%s: no metadata class", fam)
		}
	}
	// A different mode names chains differently.
	obs := goldenPlan(t, ModeObserve, true)
	if buildRules(p, v4, goldenCtrs(p)).hooks[0].target == buildRules(obs, v4, goldenCtrs(obs)).hooks[0].target {
		t.Error("observe and enforce dispatch chains share a name")
	}
}
