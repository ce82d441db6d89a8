// Command volumes benchmarks a seaweedfs volume through its FUSE mount
// against the node's local disk, in one run: sequential write and read
// MiB/s of one large file, and small-file creates per second. It starts
// its own Postgres and single-node SeaweedFS (internal/seaweed) on
// 127.0.0.1 and mounts with the real weed mount; everything lives in a
// temporary directory removed at the end. The read of each side is cold:
// the volume's through a second, fresh mount, the local file after its
// pages were dropped (fadvise DONTNEED). The measurements are of the mount
// on the node, not yet of a task inside a container. Needs root and
// /dev/fuse; the weed binary from $LEVERS9_WEED_BIN. Its last line is
//
//	write_vs_local=… read_vs_local=… creates_per_s=… creates_vs_local=…
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/levers9/levers9/internal/devstack"
	"github.com/levers9/levers9/internal/seaweed"
	"github.com/levers9/levers9/volumes"
	"github.com/levers9/levers9/volumes/seaweedfs"
)

func main() {
	quick := flag.Bool("quick", false, "64 MiB and 200 files instead of 512 MiB and 2000")
	sizeMiB := flag.Int("size", 512, "MiB written and read")
	files := flag.Int("files", 2000, "small files created")
	flag.Parse()
	if *quick {
		*sizeMiB, *files = 64, 200
	}
	weed := os.Getenv("LEVERS9_WEED_BIN")
	if weed == "" {
		log.Fatal("set LEVERS9_WEED_BIN (bash packaging/seaweedfs/build.sh prints it)")
	}
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "l9vbench-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	_ = os.Chmod(dir, 0o755)
	pg, err := devstack.StartPostgres(ctx, filepath.Join(dir, "pg"), devstack.PostgresOptions{})
	if err != nil {
		log.Fatal(err)
	}
	defer pg.Stop()
	if err := pg.CreateDatabase(ctx, "filer"); err != nil {
		log.Fatal(err)
	}
	c, err := seaweed.StartCluster(ctx, seaweed.ClusterOptions{Bin: weed, Dir: filepath.Join(dir, "sw"),
		Postgres: seaweed.PostgresStore{Host: pg.Host, Port: pg.Port, User: pg.User, Password: pg.Password, Database: "filer"}})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Stop()
	// Secured as in production: the mount's TLS and read tokens are part
	// of what is measured.
	sec, err := c.Security()
	if err != nil {
		log.Fatal(err)
	}
	creds, err := sec.MountCredentials()
	if err != nil {
		log.Fatal(err)
	}
	d := seaweedfs.New(seaweedfs.Config{Bin: weed, FilerAddr: c.FilerAddr(), FilerURL: c.FilerURL(), FilerKeys: sec.FilerKeys(),
		Env: creds.Env(), StateDir: filepath.Join(dir, "state")})
	v := volumes.Volume{ID: "vol_bench", Workspace: "ws_bench"}
	if err := d.Create(ctx, v); err != nil {
		log.Fatal(err)
	}
	mnt := filepath.Join(dir, "mnt")
	if err := d.Mount(ctx, v, mnt, volumes.MountOptions{}); err != nil {
		log.Fatal(err)
	}
	defer func() { _, _ = d.UnmountAll(ctx, dir) }()
	local := filepath.Join(dir, "local")
	if err := os.MkdirAll(local, 0o755); err != nil {
		log.Fatal(err)
	}

	size := int64(*sizeMiB) << 20
	lw := must(writeFile(filepath.Join(local, "big"), size))
	vw := must(writeFile(filepath.Join(mnt, "big"), size))
	lr := must(readFile(filepath.Join(local, "big"), size, true))
	// A fresh mount: nothing of the file in its caches or the kernel's.
	mnt2 := filepath.Join(dir, "mnt2")
	if err := d.Mount(ctx, v, mnt2, volumes.MountOptions{ReadOnly: true}); err != nil {
		log.Fatal(err)
	}
	vr := must(readFile(filepath.Join(mnt2, "big"), size, false))
	lc := must(creates(filepath.Join(local, "small"), *files))
	vc := must(creates(filepath.Join(mnt, "small"), *files))

	fmt.Printf("write MiB/s: volume %.1f, local %.1f\n", vw, lw)
	fmt.Printf("read MiB/s (cold): volume %.1f, local %.1f\n", vr, lr)
	fmt.Printf("small-file creates/s: volume %.0f, local %.0f (%d files of 1 KiB)\n", vc, lc, *files)
	fmt.Printf("write_vs_local=%.3f read_vs_local=%.3f creates_per_s=%.0f creates_vs_local=%.3f\n", vw/lw, vr/lr, vc, vc/lc)
}

func must(v float64, err error) float64 {
	if err != nil {
		log.Fatal(err)
	}
	return v
}

// writeFile writes size bytes in 1 MiB blocks and fsyncs; MiB/s.
func writeFile(path string, size int64) (float64, error) {
	block := make([]byte, 1<<20)
	_, _ = rand.Read(block)
	start := time.Now()
	f, err := os.Create(path)
	if err != nil {
		return 0, err
	}
	for n := int64(0); n < size; n += int64(len(block)) {
		if _, err := f.Write(block); err != nil {
			f.Close()
			return 0, fmt.Errorf("writing %s: %w", path, err)
		}
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return 0, err
	}
	if err := f.Close(); err != nil {
		return 0, err
	}
	return float64(size>>20) / time.Since(start).Seconds(), nil
}

// readFile reads the file through; with drop, its page cache goes first.
func readFile(path string, size int64, drop bool) (float64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	if drop {
		if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
			return 0, fmt.Errorf("dropping the cache of %s: %w", path, err)
		}
	}
	buf := make([]byte, 1<<20)
	var total int64
	start := time.Now()
	for {
		n, err := f.Read(buf)
		total += int64(n)
		if err != nil {
			break
		}
	}
	if total != size {
		return 0, fmt.Errorf("read %d bytes of %s, want %d", total, path, size)
	}
	return float64(size>>20) / time.Since(start).Seconds(), nil
}

// creates makes n files of 1 KiB in dir; files per second.
func creates(dir string, n int) (float64, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return 0, err
	}
	data := bytes.Repeat([]byte("x"), 1024)
	start := time.Now()
	for i := range n {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%06d", i)), data, 0o644); err != nil {
			return 0, err
		}
	}
	return float64(n) / time.Since(start).Seconds(), nil
}
