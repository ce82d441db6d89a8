// Command probe is the workload of sandbox's privileged integration suite: a
// static binary copied into a test rootfs that tries escapes and privileged
// operations inside a container and prints one line per probe:
//
//	PROBE <name> allowed|blocked <detail>
//
// Run without arguments it runs every probe, each in its own child process
// (some change the process's root, user or namespaces); "probe NAME" runs
// one, and PROBE_ONLY=a,b limits the full run to those. It must never change host state: writes put back the value they
// read, and nothing is sent off loopback. It is test-only; its probe names
// are the stable part (testdata/probes.tsv refers to them).
package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

type probe struct {
	run func() error
	// logged marks probes Docker's profile refuses whatever the
	// capabilities, so in seccomp log mode they leave a kernel record;
	// they linger so the agent can map the pid to its container.
	logged bool
}

func main() {
	if len(os.Args) == 2 && os.Args[1] == "whoami" {
		// The setuid copy reports what exec gave it.
		fmt.Printf("%d\n", unix.Geteuid())
		return
	}
	if len(os.Args) == 2 {
		os.Exit(runOne(os.Args[1]))
	}
	names := make([]string, 0, len(probes))
	for n := range probes {
		names = append(names, n)
	}
	if only := os.Getenv("PROBE_ONLY"); only != "" {
		names = strings.Split(only, ",")
	}
	sort.Strings(names)
	for _, n := range names {
		out, err := exec.Command("/probe", n).CombinedOutput()
		line := strings.TrimSpace(string(out))
		if err != nil && !strings.HasPrefix(line, "PROBE ") {
			line = fmt.Sprintf("PROBE %s error %v: %s", n, err, line)
		}
		fmt.Println(line)
	}
}

func runOne(name string) int {
	p, ok := probes[name]
	if !ok {
		fmt.Printf("PROBE %s error unknown probe\n", name)
		return 2
	}
	err := p.run()
	if p.logged && os.Getenv("PROBE_LINGER") != "" {
		time.Sleep(300 * time.Millisecond)
	}
	if err == nil {
		fmt.Printf("PROBE %s allowed\n", name)
	} else {
		fmt.Printf("PROBE %s blocked %s\n", name, strings.ReplaceAll(err.Error(), "\n", " "))
	}
	return 0
}

var errEmpty = errors.New("empty (masked)")

// readSome reads a file and treats an empty answer as masked.
func readSome(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if len(b) == 0 {
		return errEmpty
	}
	return nil
}

// listSome treats an empty or unreadable directory as masked.
func listSome(path string) error {
	ents, err := os.ReadDir(path)
	if err != nil {
		return err
	}
	if len(ents) == 0 {
		return errEmpty
	}
	return nil
}

// rewrite writes back what a file holds, proving write access without
// changing anything.
func rewrite(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = f.Write([]byte(strings.TrimSpace(string(b))))
	return err
}

func asUser(uid int) error {
	if err := unix.Setgroups(nil); err != nil {
		return fmt.Errorf("setgroups: %w", err)
	}
	if err := unix.Setresgid(uid, uid, uid); err != nil {
		return fmt.Errorf("setresgid: %w", err)
	}
	if err := unix.Setresuid(uid, uid, uid); err != nil {
		return fmt.Errorf("setresuid: %w", err)
	}
	return nil
}
