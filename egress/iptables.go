package egress

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// ipt drives one family's tables. Every method must run inside the node
// namespace (callers wrap them in netNS.do).
//
// Each change costs two execs: one iptables-save that reads hooks, chains
// and counters at once, and one iptables-restore that creates, swaps and
// deletes in a single transaction. Listing chain by chain (iptables -S per
// built-in, per table) cost five execs more per family and dominated the
// time a container took to join the network.
type ipt struct {
	fam     family
	prefix  string
	restore string
	save    string
	chainRE *regexp.Regexp
	// beforeRestore, when set, runs just before apply's restore (tests
	// change the rules there, as a late restore of a killed agent would).
	beforeRestore func()
}

func newIPT(fam family, prefix string) (*ipt, error) {
	bin, saveBin := "iptables-restore", "iptables-save"
	if fam == v6 {
		bin, saveBin = "ip6tables-restore", "ip6tables-save"
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
		fam: fam, prefix: prefix, restore: restore, save: save,
		chainRE: chainPattern(prefix),
	}, nil
}

func chainPattern(prefix string) *regexp.Regexp {
	return regexp.MustCompile(`^` + regexp.QuoteMeta(prefix) + `-(F|I|N|R|c[0-9a-f]{8})-[0-9a-f]{6}$`)
}

// hookRule is one of our jumps found in a built-in chain.
type hookRule struct {
	table, builtin string
	pos            int    // 1-based among the chain's rules
	spec           string // as listed, without "-A BUILTIN "
	target         string
}

var builtins = []struct{ table, chain string }{{"filter", "FORWARD"}, {"filter", "INPUT"}, {"nat", "POSTROUTING"}}

func isHooked(table, chain string) bool {
	for _, b := range builtins {
		if b.table == table && b.chain == chain {
			return true
		}
	}
	return false
}

// installed is what one iptables-save showed of ours.
type installed struct {
	hooks  []hookRule
	chains map[string][]string // by table, in listed order
	// counts holds the attributed counters of each container chain (filter
	// table): packets per (container key, class).
	counts map[string]map[counterKey]uint64
}

// parseSave reads iptables-save -c output. Lines it does not understand are
// skipped: the save format is the kernel's, and other tools' rules share it.
func parseSave(out []byte, chainRE *regexp.Regexp, ctrPrefix string) installed {
	st := installed{chains: map[string][]string{}, counts: map[string]map[counterKey]uint64{}}
	table := ""
	pos := map[string]int{} // rules seen per built-in chain of the table
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "*"):
			table, pos = line[1:], map[string]int{}
		case strings.HasPrefix(line, ":"):
			if name, _, ok := strings.Cut(line[1:], " "); ok && chainRE.MatchString(name) {
				st.chains[table] = append(st.chains[table], name)
			}
		default:
			var packets uint64
			rule := line
			if strings.HasPrefix(rule, "[") {
				m := counterLineRE.FindStringSubmatch(rule)
				if m == nil {
					continue
				}
				n, err := strconv.ParseUint(m[1], 10, 64)
				if err != nil {
					continue
				}
				packets, rule = n, rule[len(m[0]):]
			}
			rest, isRule := strings.CutPrefix(rule, "-A ")
			chain, spec, ok := strings.Cut(rest, " ")
			if !isRule || !ok {
				continue
			}
			if isHooked(table, chain) {
				pos[chain]++
				f := strings.Fields(spec)
				for i := 0; i+1 < len(f); i++ {
					if f[i] == "-j" && chainRE.MatchString(f[i+1]) {
						st.hooks = append(st.hooks, hookRule{table: table, builtin: chain, pos: pos[chain], target: f[i+1], spec: spec})
					}
				}
				continue
			}
			if table != "filter" || !strings.HasPrefix(chain, ctrPrefix) || !chainRE.MatchString(chain) {
				continue
			}
			c := ctrCommentRE.FindStringSubmatch(spec)
			if c == nil {
				continue
			}
			if st.counts[chain] == nil {
				st.counts[chain] = map[counterKey]uint64{}
			}
			st.counts[chain][counterKey{key: c[1], class: c[2]}] += packets
		}
	}
	return st
}

// inspect reads our hooks, chains and container counters in one exec.
// With table "" every table is read.
func (x *ipt) inspect(ctx context.Context, table string) (installed, error) {
	args := []string{"-c"}
	if table != "" {
		args = append(args, "-t", table)
	}
	cmd := exec.CommandContext(ctx, x.save, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return installed{}, fmt.Errorf("%s %s: %w: %s", x.fam, x.save, err, strings.TrimSpace(stderr.String()))
	}
	return parseSave(stdout.Bytes(), x.chainRE, x.prefix+"-c"), nil
}

// applyResult says what apply did.
type applyResult struct {
	created int  // chains created
	swapped bool // a hook now points at a different chain
	moved   bool // a hook was put back at position 1
	// retired holds the counters of the container chains apply deleted,
	// as read just before, to be carried into the node's base.
	retired map[counterKey]uint64
}

// apply makes the installed rules equal to rs. Chains are named by their
// content, so an installed chain with the wanted name is kept as it is
// (with its counters); only missing chains are created. The hooks are
// swapped to new dispatch chains, and chains of ours that rs does not name
// are flushed and deleted, in the same iptables-restore transaction that
// creates them, so no packet ever sees a half-built set. Idempotent, and
// converges from whatever a killed apply left: anything not hooked is
// garbage.
func (x *ipt) apply(ctx context.Context, rs ruleSet) (applyResult, error) {
	// A killed agent's iptables-restore outlives it and may still commit
	// after this apply read the rules: the restore below then names a
	// chain that is gone (or deletes one that is). It fails whole, so
	// reading again and retrying converges.
	for try := 1; ; try++ {
		res, err := x.applyOnce(ctx, rs)
		var re *restoreError
		if err == nil || !errors.As(err, &re) || try == applyTries || ctx.Err() != nil {
			return res, err
		}
	}
}

// applyTries bounds apply's read-and-restore rounds.
const applyTries = 3

// restoreError is a failed iptables-restore of apply's transaction.
type restoreError struct{ err error }

func (e *restoreError) Error() string { return e.err.Error() }
func (e *restoreError) Unwrap() error { return e.err }

// applyOnce is one round of apply: read the rules, restore the difference.
func (x *ipt) applyOnce(ctx context.Context, rs ruleSet) (applyResult, error) {
	st, err := x.inspect(ctx, "")
	if err != nil {
		return applyResult{}, err
	}
	exists := map[string]bool{}
	for _, cs := range st.chains {
		for _, c := range cs {
			exists[c] = true
		}
	}
	keep := map[string]bool{}
	for _, c := range rs.chains {
		keep[c.name] = true
	}
	res := applyResult{retired: map[counterKey]uint64{}}
	changed := false
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
			for _, h := range st.hooks {
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
		if x.writeDeletes(&in, st, table, keep, res.retired) {
			changed = true
		}
		in.WriteString("COMMIT\n")
	}
	if res.created == 0 && !res.swapped && !res.moved && !changed {
		return res, nil
	}
	if x.beforeRestore != nil {
		x.beforeRestore()
	}
	if err := x.runRestore(ctx, in.Bytes()); err != nil {
		return applyResult{}, &restoreError{fmt.Errorf("%s install rules: %w", x.fam, err)}
	}
	return res, nil
}

// writeDeletes writes the flush and delete of every chain of ours in table
// that keep does not name, and adds their counters to retired. Flushes come
// first, so chains that jump to each other can go in any order.
func (x *ipt) writeDeletes(in *bytes.Buffer, st installed, table string, keep map[string]bool, retired map[counterKey]uint64) bool {
	var gone []string
	for _, c := range st.chains[table] {
		if !keep[c] {
			gone = append(gone, c)
		}
	}
	sort.Strings(gone)
	for _, c := range gone {
		fmt.Fprintf(in, "-F %s\n", c)
		for k, v := range st.counts[c] {
			retired[k] += v
		}
	}
	for _, c := range gone {
		fmt.Fprintf(in, "-X %s\n", c)
	}
	return len(gone) > 0
}

// uninstall removes our hooks and chains in one transaction and returns the
// counters of the container chains it deleted.
func (x *ipt) uninstall(ctx context.Context) (map[counterKey]uint64, error) {
	st, err := x.inspect(ctx, "")
	if err != nil {
		return nil, err
	}
	retired := map[counterKey]uint64{}
	changed := len(st.hooks) > 0
	var in bytes.Buffer
	for _, table := range []string{"filter", "nat"} {
		fmt.Fprintf(&in, "*%s\n", table)
		for _, h := range st.hooks {
			if h.table == table {
				fmt.Fprintf(&in, "-D %s %s\n", h.builtin, h.spec)
			}
		}
		if x.writeDeletes(&in, st, table, nil, retired) {
			changed = true
		}
		in.WriteString("COMMIT\n")
	}
	if !changed {
		return retired, nil
	}
	if err := x.runRestore(ctx, in.Bytes()); err != nil {
		return nil, fmt.Errorf("%s remove rules: %w", x.fam, err)
	}
	return retired, nil
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

// counters reads the attributed counters of every container chain of ours:
// packets per (container key, class), from one iptables-save of the filter
// table.
func (x *ipt) counters(ctx context.Context) (map[counterKey]uint64, error) {
	st, err := x.inspect(ctx, "filter")
	if err != nil {
		return nil, err
	}
	out := map[counterKey]uint64{}
	for _, cs := range st.counts {
		for k, v := range cs {
			out[k] += v
		}
	}
	return out, nil
}

var counterLineRE = regexp.MustCompile(`^\[([0-9]+):[0-9]+\] `)

var ctrCommentRE = regexp.MustCompile(`ctr=([0-9a-f]{8}) class=([a-z-]+)`)

type counterKey struct{ key, class string }
