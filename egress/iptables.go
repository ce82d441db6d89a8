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
	save    string
	chainRE *regexp.Regexp
}

func newIPT(fam family, prefix string) (*ipt, error) {
	proto, bin, saveBin := iptables.ProtocolIPv4, "iptables-restore", "iptables-save"
	if fam == v6 {
		proto, bin, saveBin = iptables.ProtocolIPv6, "ip6tables-restore", "ip6tables-save"
	}
	t, err := iptables.New(iptables.IPFamily(proto), iptables.Timeout(10))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", fam, err)
	}
	restore, err := exec.LookPath(bin)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", fam, err)
	}
	save, err := exec.LookPath(saveBin)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", fam, err)
	}
	return &ipt{
		fam: fam, prefix: prefix, tables: t, restore: restore, save: save,
		chainRE: regexp.MustCompile(`^` + regexp.QuoteMeta(prefix) + `-(F|I|N|R|c[0-9a-f]{8})-[0-9a-f]{6}$`),
	}, nil
}

// hookRule is one of our jumps found in a built-in chain.
type hookRule struct {
	table, builtin string
	pos            int    // 1-based among the chain's rules
	spec           string // as listed, without "-A BUILTIN "
	target         string
}

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

// applyResult says what apply did.
type applyResult struct {
	created int  // chains created
	swapped bool // a hook now points at a different chain
	moved   bool // a hook was put back at position 1
}

// apply makes the installed rules equal to rs. Chains are named by their
// content, so an installed chain with the wanted name is kept as it is
// (with its counters); only missing chains are created, and the hooks are
// swapped to new dispatch chains in the same iptables-restore transaction
// that creates them, so no packet ever sees a half-built set. Chains of
// ours that rs does not name are handed to retire (to carry their counters)
// and deleted. Idempotent, and converges from whatever a killed apply left:
// anything not hooked is garbage.
func (x *ipt) apply(ctx context.Context, rs ruleSet, retire func(gone map[string]bool)) (applyResult, error) {
	hooks, chains, err := x.inspect()
	if err != nil {
		return applyResult{}, err
	}
	exists := map[string]bool{}
	for _, cs := range chains {
		for _, c := range cs {
			exists[c] = true
		}
	}
	var res applyResult
	var in bytes.Buffer
	for _, table := range []string{"filter", "nat"} {
		fmt.Fprintf(&in, "*%s\n", table)
		for _, c := range rs.chains {
			if c.table == table && !exists[c.name] {
				fmt.Fprintf(&in, ":%s - [0:0]\n", c.name)
			}
		}
		for _, c := range rs.chains {
			if c.table != table || exists[c.name] {
				continue
			}
			res.created++
			for _, r := range c.rules {
				fmt.Fprintf(&in, "-A %s %s\n", c.name, joinArgs(r))
			}
		}
		for _, hd := range rs.hooks {
			if hd.table != table {
				continue
			}
			var found []hookRule
			for _, h := range hooks {
				if h.table == hd.table && h.builtin == hd.builtin {
					found = append(found, h)
				}
			}
			if len(found) == 1 && found[0].target == hd.target && found[0].pos == 1 {
				continue
			}
			for _, h := range found {
				fmt.Fprintf(&in, "-D %s %s\n", h.builtin, h.spec)
				if h.target == hd.target {
					res.moved = true
				} else {
					res.swapped = true
				}
			}
			if len(found) == 0 {
				res.swapped = true
			}
			fmt.Fprintf(&in, "-I %s 1 %s\n", hd.builtin, joinArgs(hd.args(x.prefix)))
		}
		in.WriteString("COMMIT\n")
	}
	if res.created > 0 || res.swapped || res.moved {
		if err := x.runRestore(ctx, in.Bytes()); err != nil {
			return res, fmt.Errorf("%s install rules: %w", x.fam, err)
		}
	}
	keep := map[string]bool{}
	for _, c := range rs.chains {
		keep[c.name] = true
	}
	if err := x.deleteChains(ctx, chains, keep, retire); err != nil {
		return res, err
	}
	return res, nil
}

// deleteChains flushes and deletes every chain of ours not in keep, after
// handing each to retire.
func (x *ipt) deleteChains(ctx context.Context, chains map[string][]string, keep map[string]bool, retire func(gone map[string]bool)) error {
	var in bytes.Buffer
	all := map[string]bool{}
	for _, table := range []string{"filter", "nat"} {
		for _, c := range chains[table] {
			if !keep[c] {
				all[c] = true
			}
		}
	}
	if len(all) == 0 {
		return nil
	}
	if retire != nil {
		retire(all)
	}
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
			fmt.Fprintf(&in, "-F %s\n", c)
		}
		for _, c := range gone {
			fmt.Fprintf(&in, "-X %s\n", c)
		}
		in.WriteString("COMMIT\n")
	}
	if err := x.runRestore(ctx, in.Bytes()); err != nil {
		return fmt.Errorf("%s delete old chains: %w", x.fam, err)
	}
	return nil
}

// uninstall removes our hooks and chains.
func (x *ipt) uninstall(ctx context.Context, retire func(gone map[string]bool)) error {
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

// counters reads the attributed counters of the given chains of ours
// (all container chains when chains is nil): packets per (container key,
// class). One iptables-save -c reads every chain at once; asking per chain
// (go-iptables Stats) costs an exec each, which dominated at ~20 containers.
func (x *ipt) counters(ctx context.Context, chains map[string]bool) (map[counterKey]uint64, error) {
	cmd := exec.CommandContext(ctx, x.save, "-c", "-t", "filter")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("%s -c: %w: %s", x.save, err, strings.TrimSpace(stderr.String()))
	}
	out := map[counterKey]uint64{}
	for _, line := range strings.Split(stdout.String(), "\n") {
		m := counterLineRE.FindStringSubmatch(line)
		if m == nil || !strings.HasPrefix(m[2], x.prefix+"-c") || chains != nil && !chains[m[2]] {
			continue
		}
		c := ctrCommentRE.FindStringSubmatch(line)
		if c == nil {
			continue
		}
		n, err := strconv.ParseUint(m[1], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%s: bad counter in %q", x.save, line)
		}
		out[counterKey{key: c[1], class: c[2]}] += n
	}
	return out, nil
}

var counterLineRE = regexp.MustCompile(`^\[([0-9]+):[0-9]+\] -A (\S+) `)

var ctrCommentRE = regexp.MustCompile(`ctr=([0-9a-f]{8}) class=([a-z-]+)`)

type counterKey struct{ key, class string }
