package cli

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	v1 "github.com/levers9/levers9/api/levers9/v1"
	"github.com/levers9/levers9/controlplane/config"
	"github.com/levers9/levers9/internal/clientconfig"
	"github.com/levers9/levers9/internal/seaweed/seaweedtest"
)

// TestVolumeFiles: `volume ls/put/get/rm` through a real controlplane to
// a real SeaweedFS: a file put is listed with its size and read back the
// same, rm removes it, paths leaving the volume are refused, and a put
// past the quota (its size declared, or streamed from stdin with none) is
// refused and leaves no file, not even a temporary one.
func TestVolumeFiles(t *testing.T) {
	weed := seaweedtest.Bin(t)
	b := adminCLIWith(t, func(c *config.Config) {
		dir := t.TempDir()
		// The postgres user keeps the filer's files under it.
		if err := os.Chmod(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		sw := seaweedtest.StartWith(t, weed, env.PG, dir, "")
		c.Volumes.SeaweedFS.FilerAddr = sw.Cluster.FilerAddr()
		c.Volumes.SeaweedFS.FilerURL = sw.Cluster.FilerURL()
		c.Volumes.SeaweedFS.SecurityDir = sw.Cluster.SecurityDir()
	})
	cli := func(stdin string, args ...string) (string, string) {
		t.Helper()
		out, errOut, code := b.run(t, stdin, nil, args...)
		if code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, errOut)
		}
		return out, errOut
	}
	refused := func(stdin, want string, args ...string) {
		t.Helper()
		out, errOut, code := b.run(t, stdin, nil, args...)
		if code == 0 || !strings.Contains(errOut, want) {
			if len(out) > 200 {
				out = out[:200] + "..."
			}
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want a failure saying %q", args, code, out, errOut, want)
		}
	}
	cli("", "volume", "create", "data", "--quota", "1Mi")

	local := t.TempDir()
	content := make([]byte, 300_000)
	rand.Read(content)
	src := filepath.Join(local, "f.bin")
	if err := os.WriteFile(src, content, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, _ := cli("", "volume", "put", "data", src, "dir/"); !strings.Contains(out, "data:/dir/f.bin (300000 bytes)") {
		t.Errorf("put: %q", out)
	}

	type listing struct {
		Files []struct {
			Path string `json:"path"`
			Dir  bool   `json:"dir"`
			Size string `json:"size"`
		} `json:"files"`
	}
	ls := func(p string) listing {
		t.Helper()
		out, _ := cli("", "volume", "ls", "data", p, "-o", "json")
		var l listing
		if err := json.Unmarshal([]byte(out), &l); err != nil {
			t.Fatalf("ls -o json: %v\n%s", err, out)
		}
		return l
	}
	if l := ls("dir"); len(l.Files) != 1 || l.Files[0].Path != "/dir/f.bin" || l.Files[0].Size != "300000" || l.Files[0].Dir {
		t.Errorf("ls dir: %+v, want /dir/f.bin of 300000 bytes", l)
	}
	if l := ls("/dir/./f.bin"); len(l.Files) != 1 || l.Files[0].Path != "/dir/f.bin" {
		t.Errorf("ls of the file: %+v", l)
	}
	if out, _ := cli("", "volume", "ls", "data"); !strings.Contains(out, "/dir/") {
		t.Errorf("ls of the root lacks /dir/: %q", out)
	}

	dst := filepath.Join(local, "back.bin")
	cli("", "volume", "get", "data", "dir/f.bin", dst)
	if got, err := os.ReadFile(dst); err != nil || !bytes.Equal(got, content) {
		t.Errorf("get: %d bytes (%v), want the %d put", len(got), err, len(content))
	}
	if out, _ := cli("", "volume", "get", "data", "/dir/f.bin", "-"); out != string(content) {
		t.Errorf("get to stdout: %d bytes, want the %d put", len(out), len(content))
	}

	refused("", "leaves the volume", "volume", "put", "data", src, "../escape")
	refused("", "leaves the volume", "volume", "get", "data", "dir/../../etc/passwd", "-")
	refused("", "leaves the volume", "volume", "ls", "data", "..")
	refused("", "leaves the volume", "volume", "rm", "data", "a/../..")
	serverRefusesEscapes(t, b)

	// 1 MiB quota, 300 kB used: 900 kB more does not fit.
	big := filepath.Join(local, "big.bin")
	if err := os.WriteFile(big, make([]byte, 900_000), 0o644); err != nil {
		t.Fatal(err)
	}
	refused("", "volume data is full (quota 1.0 MiB)", "volume", "put", "data", big, "dir/big.bin")
	// From stdin the size is not declared: the controlplane counts.
	refused(string(make([]byte, 900_000)), "volume data is full (quota 1.0 MiB)", "volume", "put", "data", "-", "dir/stdin.bin")
	if l := ls("dir"); len(l.Files) != 1 || l.Files[0].Path != "/dir/f.bin" {
		t.Errorf("after refused puts, dir holds %+v; want only /dir/f.bin", l)
	}

	refused("", "is a directory", "volume", "rm", "data", "dir")
	if out, _ := cli("", "volume", "rm", "data", "dir/f.bin"); !strings.Contains(out, "removed data:/dir/f.bin") {
		t.Errorf("rm: %q", out)
	}
	if l := ls("dir"); len(l.Files) != 0 {
		t.Errorf("after rm, dir holds %+v", l)
	}
	refused("", "not found", "volume", "get", "data", "dir/f.bin", "-")
	cli("", "volume", "rm", "data", "dir", "-r")
	refused("", "not found", "volume", "ls", "data", "dir")

	// Without a quota: a file of several chunks each way, then replaced
	// in place by a put to the same name.
	cli("", "volume", "create", "big")
	large := make([]byte, 2_500_000)
	rand.Read(large)
	if err := os.WriteFile(big, large, 0o644); err != nil {
		t.Fatal(err)
	}
	cli("", "volume", "put", "big", big, "x/big.bin")
	if out, _ := cli("", "volume", "get", "big", "x/big.bin", "-"); out != string(large) {
		t.Errorf("get of a %d-byte file: %d bytes back, or not the same", len(large), len(out))
	}
	cli("replaced", "volume", "put", "big", "-", "x/big.bin")
	if out, _ := cli("", "volume", "get", "big", "x/big.bin", "-"); out != "replaced" {
		t.Errorf("after a put over it, get: %.40q, want %q", out, "replaced")
	}
}

// serverRefusesEscapes calls the RPCs directly, past the CLI's own check
// of the path, so the controlplane's check is what is tested.
func serverRefusesEscapes(t *testing.T, b *cliBundle) {
	t.Helper()
	c, _, err := clientconfig.Resolve(func(k string) string { return b.envvar[k] }, "")
	if err != nil {
		t.Fatal(err)
	}
	ctx := WithToken(context.Background(), c.Token)
	vs := v1.NewVolumeServiceClient(b.inst.Conn)
	want := func(what string, err error) {
		t.Helper()
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "leaves the volume") {
			t.Errorf("%s of ../x: %v; want InvalidArgument saying it leaves the volume", what, err)
		}
	}
	_, err = vs.ListVolumeFiles(ctx, &v1.ListVolumeFilesRequest{Name: "data", Path: "../x"})
	want("ListVolumeFiles", err)
	_, err = vs.DeleteVolumeFile(ctx, &v1.DeleteVolumeFileRequest{Name: "data", Path: "a/../../x", Recursive: true})
	want("DeleteVolumeFile", err)
	get, err := vs.GetVolumeFile(ctx, &v1.GetVolumeFileRequest{Name: "data", Path: "/../x"})
	if err == nil {
		_, err = get.Recv()
	}
	want("GetVolumeFile", err)
	put, err := vs.PutVolumeFile(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := put.Send(&v1.PutVolumeFileRequest{Name: "data", Path: "../x", Data: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	_, err = put.CloseAndRecv()
	want("PutVolumeFile", err)
}
