package imagebuild

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"debug/buildinfo"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
)

// PackagesLabel is the image label carrying the sha256 of the image's
// package list (the file written as dist/images/NAME.packages.txt).
const PackagesLabel = "io.levers9.image.packages.sha256"

// dpkgPackages lists the installed packages of a dpkg status file as
// "deb NAME VERSION ARCH" lines. only, when not empty, keeps just those
// package names.
func dpkgPackages(status []byte, only ...string) []string {
	var out []string
	flush := func(f map[string]string) {
		if f["Package"] == "" || !strings.HasPrefix(f["Status"], "install ok installed") {
			return
		}
		if len(only) > 0 && !slices.Contains(only, f["Package"]) {
			return
		}
		out = append(out, fmt.Sprintf("deb %s %s %s", f["Package"], f["Version"], f["Architecture"]))
	}
	fields := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(status))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			flush(fields)
			fields = map[string]string{}
			continue
		}
		if k, v, ok := strings.Cut(line, ":"); ok && !strings.HasPrefix(line, " ") {
			fields[k] = strings.TrimSpace(v)
		}
	}
	flush(fields)
	return out
}

// goModules lists the Go toolchain and modules built into the binary at
// path as "go NAME MODULE VERSION" lines, NAME being the binary's name in
// the image (what `go version -m` shows, replacements resolved).
func goModules(name, path string) ([]string, error) {
	bi, err := buildinfo.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("go modules of %s: %w", path, err)
	}
	out := []string{fmt.Sprintf("go %s %s %s", name, "stdlib", bi.GoVersion),
		fmt.Sprintf("go %s %s %s", name, bi.Main.Path, orDevel(bi.Main.Version))}
	for _, d := range bi.Deps {
		if d.Replace != nil {
			d = d.Replace
		}
		out = append(out, fmt.Sprintf("go %s %s %s", name, d.Path, orDevel(d.Version)))
	}
	return out, nil
}

func orDevel(v string) string {
	if v == "" {
		return "(devel)"
	}
	return v
}

// packageList is the sorted, newline-terminated list and its sha256.
func packageList(lines []string) ([]byte, string) {
	lines = slices.Clone(lines)
	slices.Sort(lines)
	lines = slices.Compact(lines)
	b := []byte(strings.Join(lines, "\n") + "\n")
	sum := sha256.Sum256(b)
	return b, hex.EncodeToString(sum[:])
}
