package agentdist

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/levers9/levers9/internal/errdefs"
)

func TestPrebuiltChecksumAndServe(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	body := []byte("prebuilt agent")
	os.WriteFile(filepath.Join(dir, "levers9-agent-linux-arm64"), body, 0o755)
	host := runtime.GOOS + "-" + runtime.GOARCH
	os.WriteFile(filepath.Join(dir, "levers9-agent"), []byte("host agent"), 0o755)
	d := New(dir, false, "", slog.New(slog.DiscardHandler))
	sums, err := d.Checksums(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := sha256.Sum256(body)
	if sums["linux-arm64"] != hex.EncodeToString(want[:]) {
		t.Errorf("arm64 checksum = %s", sums["linux-arm64"])
	}
	if host == "linux-amd64" && sums["linux-amd64"] == "" {
		t.Error("the plain levers9-agent must serve the host platform")
	}
	rec := httptest.NewRecorder()
	d.ServeHTTP(rec, httptest.NewRequest("GET", "/agent/v1/download/linux-arm64", nil))
	got, _ := io.ReadAll(rec.Result().Body)
	if rec.Code != 200 || string(got) != string(body) {
		t.Errorf("serve: %d %q", rec.Code, got)
	}
	for path, code := range map[string]int{"/agent/v1/download/linux-mips": 400, "/agent/v1/download/..": 400} {
		rec := httptest.NewRecorder()
		d.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
		if rec.Code != code {
			t.Errorf("%s: %d, want %d", path, rec.Code, code)
		}
	}
	rec = httptest.NewRecorder()
	d.ServeHTTP(rec, httptest.NewRequest("POST", "/agent/v1/download/linux-arm64", nil))
	if rec.Code != 405 {
		t.Errorf("POST: %d", rec.Code)
	}
}

func TestNoBinaryWithoutDevBuilds(t *testing.T) {
	t.Parallel()
	d := New(t.TempDir(), false, "/nonexistent", slog.New(slog.DiscardHandler))
	if _, err := d.Checksums(context.Background()); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("err = %v, want failed precondition", err)
	}
	if _, err := d.Path(context.Background(), "linux-amd64"); !errdefs.IsNotFound(err) {
		t.Errorf("Path err = %v", err)
	}
}

// TestDevBuild builds the real agent from this checkout when no prebuilt
// binary exists and dev builds are on.
func TestDevBuild(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("agents are built for linux")
	}
	wd, _ := os.Getwd()
	src, ok := FindSource(wd)
	if !ok {
		t.Fatal("levers9 checkout not found above", wd)
	}
	d := New(t.TempDir(), true, src, slog.New(slog.DiscardHandler))
	host := runtime.GOOS + "-" + runtime.GOARCH
	p, err := d.Path(context.Background(), host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(filepath.Dir(p)) })
	st, err := os.Stat(p)
	if err != nil || st.Size() < 1<<20 {
		t.Fatalf("built agent %s: %v", p, err)
	}
	again, err := d.Path(context.Background(), host)
	if err != nil || again != p {
		t.Errorf("second Path rebuilt or failed: %s %v", again, err)
	}
}
