package agentdist

import (
	"context"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/levers9/levers9/internal/clock"
)

// fakeGo is a "go" that counts its runs in a file and fails, printing the
// source directory as a real compiler error would.
func fakeGo(t *testing.T) (bin, count string) {
	t.Helper()
	dir := t.TempDir()
	count = filepath.Join(dir, "runs")
	bin = filepath.Join(dir, "go")
	script := "#!/bin/sh\necho run >> " + count + "\nsleep 0.2\necho \"$PWD/cmd/levers9-agent/main.go:1: syntax error\" >&2\nexit 1\n"
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return bin, count
}

func runs(t *testing.T, count string) int {
	t.Helper()
	b, err := os.ReadFile(count)
	if os.IsNotExist(err) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(b), "run")
}

// TestDevBuildsRateLimited: a stream of download requests for a platform
// whose dev build fails makes the controlplane compile once, not once per
// request; the failure is remembered for five minutes; and no answer names
// the binaries or source directory.
func TestDevBuildsRateLimited(t *testing.T) {
	t.Parallel()
	bin, count := fakeGo(t)
	binDir := filepath.Join(t.TempDir(), "secret-binaries-dir")
	srcDir := filepath.Join(t.TempDir(), "secret-source-dir")
	for _, d := range []string{binDir, srcDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	d := New(binDir, true, srcDir, slog.New(slog.DiscardHandler))
	fake := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	d.clock, d.goBin = fake, bin

	get := func(url string) (int, string) {
		rec := httptest.NewRecorder()
		d.ServeHTTP(rec, httptest.NewRequest("GET", url, nil))
		b, _ := io.ReadAll(rec.Result().Body)
		return rec.Code, string(b)
	}
	check := func(code int, body string) {
		t.Helper()
		if code < 400 {
			t.Errorf("a failed build answered %d", code)
		}
		for _, dir := range []string{binDir, srcDir, "secret-"} {
			if strings.Contains(body, dir) {
				t.Errorf("answer %q names a directory", body)
			}
		}
	}
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			url := "/agent/v1/download/linux-arm64"
			if i%2 == 0 {
				url += "?dev=1"
			}
			check(get(url))
		}()
	}
	wg.Wait()
	if n := runs(t, count); n != 1 {
		t.Errorf("20 requests ran the compiler %d times, want 1", n)
	}
	fake.Advance(2 * time.Minute)
	check(get("/agent/v1/download/linux-arm64"))
	if _, err := d.DevChecksums(context.Background()); err == nil || strings.Contains(err.Error(), srcDir) || strings.Contains(err.Error(), binDir) {
		t.Errorf("DevChecksums err = %v", err)
	}
	if n := runs(t, count); n != 2 {
		t.Errorf("after 2 minutes: %d compiler runs, want 2 (the failure for linux-arm64 is cached, the host platform is built once)", n)
	}
	fake.Advance(4 * time.Minute)
	check(get("/agent/v1/download/linux-arm64"))
	if n := runs(t, count); n != 3 {
		t.Errorf("after the failure expired: %d compiler runs, want 3", n)
	}

	// Without dev builds, errors name no directory either.
	off := New(binDir, false, "", slog.New(slog.DiscardHandler))
	rec := httptest.NewRecorder()
	off.ServeHTTP(rec, httptest.NewRequest("GET", "/agent/v1/download/linux-arm64", nil))
	b, _ := io.ReadAll(rec.Result().Body)
	check(rec.Code, string(b))
	if _, err := off.Checksums(context.Background()); err == nil || strings.Contains(err.Error(), binDir) {
		t.Errorf("Checksums err = %v, must not name the directory", err)
	}
}
