package egress

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/coreos/go-iptables/iptables"
)

// ipt drives one family's tables. Every method must run inside the node
// namespace (callers wrap them in netNS.do).
type ipt struct {
	fam     family
	prefix  string
	tables  *iptables.IPTables
	restore string
	chainRE *regexp.Regexp
}

func newIPT(fam family, prefix string) (*ipt, error) {
	proto, bin := iptables.ProtocolIPv4, "iptables-restore"
	if fam == v6 {
		proto, bin = iptables.ProtocolIPv6, "ip6tables-restore"
	}
	t, err := iptables.New(iptables.IPFamily(proto), iptables.Timeout(10))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", fam, err)
	}
	restore, err := exec.LookPath(bin)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", fam, err)
	}
	return &ipt{
		fam: fam, prefix: prefix, tables: t, restore: restore,
		chainRE: regexp.MustCompile(`^` + regexp.QuoteMeta(prefix) + `-(F|I|N|R|c[0-9a-f]{8})-([0-9]+)$`),
	}, nil
}

// hookRule is one of our jumps found in a built-in chain.
type hookRule struct {
	table, builtin string
	pos            int    // 1-based among the chain's rules
	spec           string // as listed, without "-A BUILTIN "
	target, sum    string
}

var sumRE = regexp.MustCompile(`sum=([0-9a-f]+)`)

var builtins = []struct{ table, chain string }{{"filter", "FORWARD"}, {"filter", "INPUT"}, {"nat", "POSTROUTING"}}

// inspect lists our hooks and chains.
func (x *ipt) inspect() (hooks []hookRule, chains map[string][]string, err error) {
	chains = map[string][]string{}
	for _, b := range builtins {
		lines, err := x.tables.List(b.table, b.chain)
		if err != nil {
			return nil, nil, fmt.Errorf("%s list %s %s: %w", x.fam, b.table, b.chain, err)
		}
		pos := 0
		for _, l := range lines {
			if !strings.HasPrefix(l, "-A ") {
				continue
			}
			pos++
			f := strings.Fields(l)
			for i := 0; i+1 < len(f); i++ {
				if f[i] == "-j" && x.chainRE.MatchString(f[i+1]) {
					h := hookRule{table: b.table, builtin: b.chain, pos: pos, target: f[i+1],
						spec: strings.TrimPrefix(l, "-A "+b.chain+" ")}
					if m := sumRE.FindStringSubmatch(l); m != nil {
						h.sum = m[1]
					}
					hooks = append(hooks, h)
				}
			}
		}
	}
	for _, table := range []string{"filter", "nat"} {
		names, err := x.tables.ListChains(table)
		if err != nil {
			return nil, nil, fmt.Errorf("%s list chains %s: %w", x.fam, table, err)
		}
		for _, n := range names {
			if x.chainRE.MatchString(n) {
				chains[table] = append(chains[table], n)
			}
		}
	}
	return hooks, chains, nil
}

func (x *ipt) genOf(chain string) int {
	m := x.chainRE.FindStringSubmatch(chain)
	if m == nil {
		return -1
	}
	g, _ := strconv.Atoi(m[2])
	return g
}

// applyResult says what apply did.
type applyResult struct {
	gen     int
	changed bool // a new generation was installed
	moved   bool // hooks were put back at position 1
}

// apply makes the installed rules equal to build's, swapping in a new
// generation only when the content changed. retire is called with each of
// our chains about to be deleted (to read its final counters) while it still
// exists. Safe to repeat; converges from any partial state a killed apply
// left, since everything not hooked is garbage.
func (x *ipt) apply(ctx context.Context, build func(g string) ruleSet, retire func(table, chain string)) (applyResult, error) {
	want := build("G")
	hooks, chains, err := x.inspect()
	if err != nil {
		return applyResult{}, err
	}
	exists := map[string]bool{}
	maxGen := 0
	for _, cs := range chains {
		for _, c := range cs {
			exists[c] = true
			maxGen = max(maxGen, x.genOf(c))
		}
	}
	// Is the installed generation current?
	cur := -1
	ok := true
	for _, hd := range want.hooks {
		var found []hookRule
		for _, h := range hooks {
			if h.table == hd.table && h.builtin == hd.builtin {
				found = append(found, h)
			}
		}
		if len(found) != 1 || found[0].sum != want.sum || !exists[found[0].target] {
			ok = false
			break
		}
		g := x.genOf(found[0].target)
		if cur == -1 {
			cur = g
		} else if cur != g {
			ok = false
		}
	}
	var res applyResult
	var keep ruleSet
	if ok && cur >= 0 {
		keep = build(strconv.Itoa(cur))
		for _, c := range keep.chains {
			if !exists[c.name] {
				ok = false
			}
		}
	}
	if ok && cur >= 0 {
		res.gen = cur
		var in bytes.Buffer
		for _, table := range []string{"filter", "nat"} {
			fmt.Fprintf(&in, "*%s\n", table)
			for _, h := range hooks {
				if h.table == table && h.pos != 1 {
					fmt.Fprintf(&in, "-D %s %s\n-I %s 1 %s\n", h.builtin, h.spec, h.builtin, h.spec)
					res.moved = true
				}
			}
			in.WriteString("COMMIT\n")
		}
		if res.moved {
			if err := x.runRestore(ctx, in.Bytes()); err != nil {
				return res, fmt.Errorf("%s move hooks to position 1: %w", x.fam, err)
			}
		}
	} else {
		res.gen, res.changed = maxGen+1, true
		keep = build(strconv.Itoa(res.gen))
		keep.sum = want.sum
		var in bytes.Buffer
		for _, table := range []string{"filter", "nat"} {
			fmt.Fprintf(&in, "*%s\n", table)
			for _, c := range keep.chains {
				if c.table == table {
					fmt.Fprintf(&in, ":%s - [0:0]\n", c.name)
				}
			}
			for _, c := range keep.chains {
				if c.table != table {
					continue
				}
				for _, r := range c.rules {
					fmt.Fprintf(&in, "-A %s %s\n", c.name, joinArgs(r))
				}
			}
			// Swap: the old jump goes in the same transaction the
			// new one arrives, so no packet sees neither.
			for _, h := range hooks {
				if h.table == table {
					fmt.Fprintf(&in, "-D %s %s\n", h.builtin, h.spec)
				}
			}
			for _, h := range keep.hooks {
				if h.table == table {
					fmt.Fprintf(&in, "-I %s 1 %s\n", h.builtin, joinArgs(h.args(x.prefix, want.sum)))
				}
			}
			in.WriteString("COMMIT\n")
		}
		if err := x.runRestore(ctx, in.Bytes()); err != nil {
			return res, fmt.Errorf("%s install generation %d: %w", x.fam, res.gen, err)
		}
	}
	keepNames := map[string]bool{}
	for _, c := range keep.chains {
		keepNames[c.name] = true
	}
	if err := x.deleteChains(ctx, chains, keepNames, retire); err != nil {
		return res, err
	}
	return res, nil
}

// deleteChains flushes and deletes every chain of ours not in keep, after
// handing each to retire.
func (x *ipt) deleteChains(ctx context.Context, chains map[string][]string, keep map[string]bool, retire func(table, chain string)) error {
	var in bytes.Buffer
	any := false
	for _, table := range []string{"filter", "nat"} {
		var gone []string
		for _, c := range chains[table] {
			if !keep[c] {
				gone = append(gone, c)
			}
		}
		sort.Strings(gone)
		fmt.Fprintf(&in, "*%s\n", table)
		for _, c := range gone {
			if retire != nil {
				retire(table, c)
			}
			fmt.Fprintf(&in, "-F %s\n", c)
			any = true
		}
		for _, c := range gone {
			fmt.Fprintf(&in, "-X %s\n", c)
		}
		in.WriteString("COMMIT\n")
	}
	if !any {
		return nil
	}
	if err := x.runRestore(ctx, in.Bytes()); err != nil {
		return fmt.Errorf("%s delete old chains: %w", x.fam, err)
	}
	return nil
}

// uninstall removes our hooks and chains.
func (x *ipt) uninstall(ctx context.Context, retire func(table, chain string)) error {
	hooks, chains, err := x.inspect()
	if err != nil {
		return err
	}
	if len(hooks) > 0 {
		var in bytes.Buffer
		for _, table := range []string{"filter", "nat"} {
			fmt.Fprintf(&in, "*%s\n", table)
			for _, h := range hooks {
				if h.table == table {
					fmt.Fprintf(&in, "-D %s %s\n", h.builtin, h.spec)
				}
			}
			in.WriteString("COMMIT\n")
		}
		if err := x.runRestore(ctx, in.Bytes()); err != nil {
			return fmt.Errorf("%s remove hooks: %w", x.fam, err)
		}
	}
	return x.deleteChains(ctx, chains, nil, retire)
}

func (x *ipt) runRestore(ctx context.Context, input []byte) error {
	cmd := exec.CommandContext(ctx, x.restore, "--noflush", "--wait")
	cmd.Stdin = bytes.NewReader(input)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s: %w: %s", x.restore, err, strings.TrimSpace(stderr.String()))
	}
	return nil
}

// counters reads the attributed counters of one of our container chains:
// packets per (container key, class).
func (x *ipt) counters(chain string) (map[counterKey]uint64, error) {
	stats, err := x.tables.StructuredStats("filter", chain)
	if err != nil {
		return nil, fmt.Errorf("%s stats %s: %w", x.fam, chain, err)
	}
	out := map[counterKey]uint64{}
	for _, s := range stats {
		m := ctrCommentRE.FindStringSubmatch(s.Options)
		if m == nil {
			continue
		}
		out[counterKey{key: m[1], class: m[2]}] += s.Packets
	}
	return out, nil
}

var ctrCommentRE = regexp.MustCompile(`ctr=([0-9a-f]{8}) class=([a-z-]+)`)

type counterKey struct{ key, class string }
