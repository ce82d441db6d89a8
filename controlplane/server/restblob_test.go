package server_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/controlplane/controlplanetest"
	"github.com/levers9/levers9/controlplane/images"
	"github.com/levers9/levers9/internal/devstack"
)

// TestRESTBlobUpload: PUT /api/v1/blobs/{digest} streams a raw body into
// ImageService.PutBlob over the real REST port: a blob larger than the
// 4 MiB every other REST body is held to is stored (StatBlob over gRPC and
// REST then sees it, and another workspace does not); a body that does not
// hash to the digest, a missing token, a body over the blob limit (refused
// before it is read) and a body without a length are refused in the
// gateway's JSON error shape with their HTTP status.
func TestRESTBlobUpload(t *testing.T) {
	t.Parallel()
	reg, err := devstack.StartRegistry(context.Background(), filepath.Join(t.TempDir(), "registry"), "127.0.0.1", 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = reg.Stop() })
	cfg := env.Config(t)
	cfg.Worker.ImageRegistry = reg.Addr()
	in := controlplanetest.Start(t, cfg, true)
	a := bootstrap(t, in.Conn, "test-bootstrap-secret-0123456789abcdef")
	_, otherTok := secondWorkspace(t, in, "other")
	base := "http://" + in.Server.RESTAddr() + "/api/v1/blobs/"

	blob := make([]byte, 5<<20+123)
	if _, err := rand.Read(blob); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(blob)
	digest := "sha256:" + hex.EncodeToString(sum[:])

	put := func(t *testing.T, digest, token string, body io.Reader, length int64) (int, map[string]any) {
		t.Helper()
		req, _ := http.NewRequest("PUT", base+digest, body)
		req.ContentLength = length
		req.Header.Set("Content-Type", "application/octet-stream")
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatalf("status %d, body %.300q is not JSON", resp.StatusCode, b)
		}
		return resp.StatusCode, m
	}
	wantError := func(t *testing.T, code int, m map[string]any, wantCode int, grpcCode int, msg string) {
		t.Helper()
		if code != wantCode || m["code"] != float64(grpcCode) || !strings.Contains(fmt.Sprint(m["message"]), msg) {
			t.Errorf("status %d %v, want %d with code %d and a message containing %q", code, m, wantCode, grpcCode, msg)
		}
		if _, ok := m["details"]; !ok {
			t.Errorf("error %v lacks the gateway's details", m)
		}
	}
	stat := func(t *testing.T, token string) (int, map[string]any) {
		t.Helper()
		req, _ := http.NewRequest("GET", base+digest, nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var m map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&m)
		return resp.StatusCode, m
	}

	t.Run("no token", func(t *testing.T) {
		code, m := put(t, digest, "", bytes.NewReader(blob[:1000]), 1000)
		wantError(t, code, m, http.StatusUnauthorized, 16, "")
	})
	t.Run("wrong digest", func(t *testing.T) {
		other := sha256.Sum256([]byte("something else"))
		code, m := put(t, "sha256:"+hex.EncodeToString(other[:]), a.Token, bytes.NewReader(blob), int64(len(blob)))
		wantError(t, code, m, http.StatusBadRequest, 3, "its bytes hash to "+digest)
	})
	t.Run("not a digest", func(t *testing.T) {
		code, m := put(t, "sha256:xyz", a.Token, bytes.NewReader(blob[:10]), 10)
		wantError(t, code, m, http.StatusBadRequest, 3, "want sha256:<64 hex>")
	})
	t.Run("over the blob limit", func(t *testing.T) {
		body := &endless{n: images.DefaultBlobLimit + 1}
		code, m := put(t, digest, a.Token, io.NopCloser(body), images.DefaultBlobLimit+1)
		wantError(t, code, m, http.StatusRequestEntityTooLarge, 8, fmt.Sprint(images.DefaultBlobLimit))
		if n := body.sent.Load(); n > 32<<20 {
			t.Errorf("the server read %d bytes of a refused body", n)
		}
	})
	t.Run("no length", func(t *testing.T) {
		code, m := put(t, digest, a.Token, io.NopCloser(bytes.NewReader(blob)), -1)
		wantError(t, code, m, http.StatusLengthRequired, 3, "Content-Length")
	})

	if code, m := stat(t, a.Token); code != http.StatusOK || m["exists"] == true {
		t.Fatalf("before the upload: %d %v", code, m)
	}
	code, m := put(t, digest, a.Token, bytes.NewReader(blob), int64(len(blob)))
	if code != http.StatusOK || m["digest"] != digest || m["size"] != fmt.Sprint(len(blob)) {
		t.Fatalf("upload of %d bytes: %d %v", len(blob), code, m)
	}
	st, err := v1.NewImageServiceClient(in.Conn).StatBlob(withToken(context.Background(), a.Token), &v1.StatBlobRequest{Digest: digest})
	if err != nil || !st.Exists || st.Size != int64(len(blob)) {
		t.Fatalf("StatBlob after the upload: %v, %v", st, err)
	}
	if code, m := stat(t, a.Token); code != http.StatusOK || m["exists"] != true {
		t.Errorf("REST stat after the upload: %d %v", code, m)
	}
	if code, m := stat(t, otherTok); code != http.StatusOK || m["exists"] == true {
		t.Errorf("another workspace sees the blob: %d %v", code, m)
	}
}
