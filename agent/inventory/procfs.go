package inventory

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
)

// readCPUInfo reads and parses a /proc/cpuinfo file.
func readCPUInfo(path string) (CPU, error) {
	f, err := os.Open(path)
	if err != nil {
		return CPU{}, err
	}
	defer f.Close()
	cpu, err := parseCPUInfo(f)
	if err != nil {
		return CPU{}, fmt.Errorf("%s: %w", path, err)
	}
	return cpu, nil
}

// modelKeys are the cpuinfo keys naming the processor, by preference: x86
// uses "model name", 32-bit arm "Processor"/"model name", ppc64 "cpu".
var modelKeys = []string{"model name", "Processor", "cpu"}

// parseCPUInfo counts "processor" entries and takes the first model name.
// Lines without a colon (blank separators) are skipped; a "processor" entry
// whose value is not a number is an error, because it means the format is not
// the one counted here.
func parseCPUInfo(r io.Reader) (CPU, error) {
	var cpu CPU
	models := make(map[string]string)
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64*1024), 1024*1024) // "flags" lines are long
	for line := 1; sc.Scan(); line++ {
		key, value, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		key, value = strings.TrimSpace(key), strings.TrimSpace(value)
		if key == "processor" {
			if _, err := strconv.ParseUint(value, 10, 32); err != nil {
				return CPU{}, fmt.Errorf("line %d: processor %q is not a number", line, truncate(value, 32))
			}
			cpu.Count++
			continue
		}
		if _, seen := models[key]; !seen && value != "" {
			models[key] = value
		}
	}
	if err := sc.Err(); err != nil {
		return CPU{}, fmt.Errorf("read cpuinfo: %w", err)
	}
	if cpu.Count == 0 {
		return CPU{}, fmt.Errorf("no \"processor\" entries")
	}
	for _, k := range modelKeys {
		if m, ok := models[k]; ok {
			cpu.Model = m
			break
		}
	}
	return cpu, nil
}

// readMemTotal reads and parses a /proc/meminfo file.
func readMemTotal(path string) (uint64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	n, err := parseMemTotal(f)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", path, err)
	}
	return n, nil
}

// parseMemTotal returns MemTotal in bytes. The kernel prints it as
// "MemTotal:  24683548 kB" (kB meaning KiB).
func parseMemTotal(r io.Reader) (uint64, error) {
	sc := bufio.NewScanner(r)
	for line := 1; sc.Scan(); line++ {
		key, value, ok := strings.Cut(sc.Text(), ":")
		if !ok || strings.TrimSpace(key) != "MemTotal" {
			continue
		}
		fields := strings.Fields(value)
		if len(fields) != 2 || fields[1] != "kB" {
			return 0, fmt.Errorf("line %d: MemTotal: want \"N kB\", got %q", line, truncate(strings.TrimSpace(value), 32))
		}
		kib, err := strconv.ParseUint(fields[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("line %d: MemTotal: %q is not a number", line, truncate(fields[0], 32))
		}
		if kib == 0 {
			return 0, fmt.Errorf("line %d: MemTotal: is 0", line)
		}
		if kib > math.MaxUint64/1024 {
			return 0, fmt.Errorf("line %d: MemTotal: %d kB overflows", line, kib)
		}
		return kib * 1024, nil
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("read meminfo: %w", err)
	}
	return 0, fmt.Errorf("no MemTotal line")
}
