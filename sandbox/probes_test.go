package sandbox

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/levers9/levers9/internal/testenv"
)

// probeCombo is one runtime x profile x seccomp column of probes.tsv.
// DropNetRaw follows the profile (hardened pools drop it), so the datagram
// ping probe runs with NET_RAW dropped.
type probeCombo struct {
	rt      RuntimeName
	profile Profile
	seccomp SeccompMode
}

func (c probeCombo) String() string { return fmt.Sprintf("%s/%s/%s", c.rt, c.profile, c.seccomp) }

func allCombos() []probeCombo {
	var out []probeCombo
	for _, rt := range bothRuntimes {
		for _, p := range []Profile{ProfileLegacy, ProfileHardened} {
			for _, s := range []SeccompMode{SeccompOff, SeccompLog, SeccompEnforce} {
				out = append(out, probeCombo{rt, p, s})
			}
		}
	}
	return out
}

// probeTable is testdata/probes.tsv: per probe, the expected outcome for
// each combination, and the syscall number (amd64) a seccomp-log run must
// leave in the kernel log ("-" for none).
type probeTable struct {
	columns []string
	rows    map[string]map[string]string
	logged  map[string]int
	order   []string
}

func readProbeTable(t *testing.T, path string) probeTable {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tab := probeTable{rows: map[string]map[string]string{}, logged: map[string]int{}}
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Split(line, "\t")
		if tab.columns == nil {
			tab.columns = fields
			continue
		}
		if len(fields) != len(tab.columns) {
			t.Fatalf("%s:%d: %d fields, header has %d", path, n, len(fields), len(tab.columns))
		}
		name := fields[0]
		row := map[string]string{}
		for i, c := range tab.columns[1:] {
			v := fields[i+1]
			if c == "log_syscall" {
				if v != "-" {
					var nr int
					if _, err := fmt.Sscanf(v, "%d", &nr); err != nil {
						t.Fatalf("%s:%d: log_syscall %q", path, n, v)
					}
					tab.logged[name] = nr
				}
				continue
			}
			if v != "allowed" && v != "blocked" {
				t.Fatalf("%s:%d: column %s: %q is not allowed or blocked", path, n, c, v)
			}
			row[c] = v
		}
		tab.rows[name] = row
		tab.order = append(tab.order, name)
	}
	return tab
}

// runProbes runs every probe in one container for a combination and
// returns outcome and detail per probe.
func runProbes(t *testing.T, b bundle, probe string, c probeCombo, env []string, suffix string) (map[string][2]string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rootfs := makeRootfs(t, probe)
	var out testenv.SyncBuffer
	id := strings.ReplaceAll(c.String(), "/", "-") + "-" + suffix
	sec := Security{Profile: c.profile, Seccomp: c.seccomp, DropNetRaw: c.profile == ProfileHardened, Runtime: c.rt}
	h, err := b.sb.Run(ctx, TaskSpec{ID: id, Rootfs: rootfs, Args: []string{"/probe"}, Env: env}, sec, Stdio{Stdout: &out, Stderr: &out})
	if err != nil {
		t.Fatalf("%s: %v", c, err)
	}
	t.Cleanup(func() { _ = h.Delete(context.Background()) })
	st, err := h.Wait(ctx)
	if err != nil || st.Code != 0 {
		t.Fatalf("%s: probe exit %+v %v\n%s", c, st, err, out.String())
	}
	res := map[string][2]string{}
	for _, line := range strings.Split(out.String(), "\n") {
		f := strings.SplitN(line, " ", 4)
		if len(f) < 3 || f[0] != "PROBE" {
			continue
		}
		detail := ""
		if len(f) == 4 {
			detail = f[3]
		}
		res[f[1]] = [2]string{f[2], detail}
	}
	return res, h.ID
}

func TestProbes(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireBinary(t, "runc", "runsc", "go")
	b := setupSandbox(t)
	probe := buildProbe(t, t.TempDir())
	tabPath := filepath.Join("testdata", "probes.tsv")

	// Kernel records first: the kernel prints audit records through
	// printk's rate limit (10 per 5s), so these runs do only the probes
	// whose record is checked, before the full runs use up the burst.
	if !*update {
		reader := setupSeccompReader(t)
		b.sb.cfg.SeccompLog = reader.r
		tab := readProbeTable(t, tabPath)
		var only []string
		for name := range tab.logged {
			only = append(only, name)
		}
		sort.Strings(only)
		for _, p := range []Profile{ProfileLegacy, ProfileHardened} {
			c := probeCombo{RuntimeRunc, p, SeccompLog}
			_, id := runProbes(t, b, probe, c, []string{"PROBE_LINGER=1", "PROBE_ONLY=" + strings.Join(only, ",")}, "records")
			checkSeccompLog(t, reader, id, tab, c)
		}
	}

	observed := map[string]map[string][2]string{}
	for _, c := range allCombos() {
		res, _ := runProbes(t, b, probe, c, nil, "all")
		observed[c.String()] = res
		if testing.Verbose() {
			for n, r := range res {
				t.Logf("%s %s: %s %s", c, n, r[0], r[1])
			}
		}
	}
	if *update {
		writeProbeTable(t, tabPath, observed)
		return
	}
	tab := readProbeTable(t, tabPath)
	if len(tab.rows) < 25 {
		t.Errorf("only %d probes in %s, want at least 25", len(tab.rows), tabPath)
	}
	for _, name := range tab.order {
		for _, c := range allCombos() {
			want, ok := tab.rows[name][c.String()]
			if !ok {
				t.Errorf("%s: no column %s", name, c)
				continue
			}
			got, ran := observed[c.String()][name]
			if !ran {
				t.Errorf("%s under %s: probe did not report", name, c)
				continue
			}
			if got[0] != want {
				t.Errorf("%s under %s: %s (%s), want %s", name, c, got[0], got[1], want)
			}
		}
	}
	for _, c := range allCombos() {
		for name := range observed[c.String()] {
			if _, ok := tab.rows[name]; !ok {
				t.Errorf("probe %s has no row in %s", name, tabPath)
			}
		}
	}
}

func writeProbeTable(t *testing.T, path string, observed map[string]map[string][2]string) {
	t.Helper()
	var old probeTable
	if _, err := os.Stat(path); err == nil {
		old = readProbeTable(t, path)
	}
	var names []string
	for n := range observed[allCombos()[0].String()] {
		names = append(names, n)
	}
	sort.Strings(names)
	var sb strings.Builder
	sb.WriteString("# Expected outcome of each escape/privilege probe (sandbox/internal/probe) per\n")
	sb.WriteString("# runtime/profile/seccomp. allowed = the operation succeeded inside the container.\n")
	sb.WriteString("# Hardened columns run with dropNetRaw. log_syscall: syscall nr (amd64) a runc\n")
	sb.WriteString("# seccomp-log run must leave as an audit type=1326 record, or -.\n")
	cols := []string{"probe"}
	for _, c := range allCombos() {
		cols = append(cols, c.String())
	}
	cols = append(cols, "log_syscall")
	sb.WriteString(strings.Join(cols, "\t") + "\n")
	for _, n := range names {
		row := []string{n}
		for _, c := range allCombos() {
			row = append(row, observed[c.String()][n][0])
		}
		ls := "-"
		if nr, ok := old.logged[n]; ok {
			ls = fmt.Sprint(nr)
		}
		row = append(row, ls)
		sb.WriteString(strings.Join(row, "\t") + "\n")
	}
	if err := os.WriteFile(path, []byte(sb.String()), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestProbeDetectsEscapes is the probes' positive control: run on the host
// as root, where nothing confines them, the escape probes must report
// allowed, so a "blocked" in a container means the container blocked it.
func TestProbeDetectsEscapes(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireBinary(t, "go")
	probe := buildProbe(t, t.TempDir())
	for _, name := range []string{"leaked_fds", "read_proc_interrupts", "read_proc_timer_list", "unshare_net", "packet_socket", "setuid_escalation"} {
		t.Run(name, func(t *testing.T) {
			cmd := exec.Command(probe, name)
			if name == "leaked_fds" {
				f, err := os.Open("/dev/null")
				if err != nil {
					t.Fatal(err)
				}
				defer f.Close()
				cmd.ExtraFiles = []*os.File{f}
			}
			if name == "unshare_net" {
				// Keep the host's network untouched.
				cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET}
			}
			if name == "setuid_escalation" {
				// The probe execs /suidprobe; give it a root of its own.
				root := makeRootfs(t, probe)
				if err := syscall.Mknod(filepath.Join(root, "dev/null"), syscall.S_IFCHR|0o666, 1<<8|3); err != nil {
					t.Fatal(err)
				}
				cmd = exec.Command("/probe", name)
				cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: root}
			}
			out, err := cmd.CombinedOutput()
			if err != nil || !strings.Contains(string(out), "PROBE "+name+" allowed") {
				t.Errorf("%v: %s", err, out)
			}
		})
	}
}
