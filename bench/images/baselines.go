package main

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/levers9/levers9/internal/benchstack"
)

// bareRun times a bare `runc run` of the recipe's run step command in
// the stack's bare bundle (the busybox bundle with the default pool's
// hardened spec bench/tasks uses), to its exit.
func bareRun(bundle *benchstack.Bundle, round int, nonce string) (time.Duration, error) {
	cmd, err := bundle.Command(round, "/bin/sh", "-c", fmt.Sprintf("echo %s > /built.txt && echo %s", nonce, ranLine))
	if err != nil {
		return 0, err
	}
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	err = cmd.Run()
	d := time.Since(start)
	if err != nil {
		return 0, fmt.Errorf("runc run: %w: %s", err, out.String())
	}
	if !strings.Contains(out.String(), ranLine) {
		return 0, fmt.Errorf("runc run printed %q, not %q", out.String(), ranLine)
	}
	return d, nil
}

// med is the median (the mean of the middle two for an even count).
func med(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	n := len(s)
	if n == 0 {
		return 0
	}
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

func minOf(d []time.Duration) time.Duration { return slices.Min(d) }
func maxOf(d []time.Duration) time.Duration { return slices.Max(d) }

// ms formats d in milliseconds.
func ms(d time.Duration) string {
	return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond))
}
