// Command volumes benchmarks a seaweedfs volume inside a task, through its
// FUSE mount, against the node's local disk, in one run: sequential write
// and read MiB/s of one large file, and small-file creates per second.
// It starts its own Postgres and single-node SeaweedFS (internal/seaweed)
// on 127.0.0.1 and mounts with the real weed mount. The work runs inside
// hardened runc containers as the agent runs tasks (a busybox root, the
// default pool's hardened spec with seccomp enforced, built by
// sandbox.BuildSpec), one container per phase, each with the volume's
// mount bound at /vol and a directory of the node's disk at /local as the
// agent's volume hook binds volumes (nosuid,nodev forced by the sandbox):
// busybox dd for the large file (conv=fsync on write, from a random file
// bound at /src), and a shell loop for the small files. Each phase is
// timed from the host between the task's "ready" line and its "done"
// line, so the start and stop of the container (printed: an empty runc
// run of the same bundle) are not in the figures. The read of each side
// is cold: the volume's through a second, fresh mount, the local file
// after its pages were dropped from the host (fadvise DONTNEED).
// Everything (containers, their cgroups, mounts) lives in or under a
// temporary directory and is removed at the end, also on error or
// interrupt. Needs root, runc and /dev/fuse; the weed binary from
// $LEVERS9_WEED_BIN. Its last line is
//
//	write_vs_local=… read_vs_local=… creates_per_s=… creates_vs_local=…
package main

import (
	"context"
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/levers9/levers9/internal/devstack"
	"github.com/levers9/levers9/internal/seaweed"
	"github.com/levers9/levers9/sandbox"
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
	if *sizeMiB <= 0 || *files <= 0 {
		log.Fatal("-size and -files must be positive")
	}
	weed := os.Getenv("LEVERS9_WEED_BIN")
	if weed == "" {
		log.Fatal("set LEVERS9_WEED_BIN (bash packaging/seaweedfs/build.sh prints it)")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, weed, *sizeMiB, *files)
	stop()
	if err != nil {
		log.Fatal(err)
	}
}

// run sets up the stack, runs the phases and prints the figures; what it
// set up is gone when it returns.
func run(ctx context.Context, weed string, sizeMiB, files int) (err error) {
	dir, err := os.MkdirTemp("", "l9vbench-")
	if err != nil {
		return err
	}
	_ = os.Chmod(dir, 0o755)
	// Cleanup runs on a context of its own: an interrupt must not stop it.
	bg := context.WithoutCancel(ctx)
	var b *bundle
	defer func() {
		var errs []error
		if b != nil {
			errs = append(errs, b.cleanup())
		}
		// Never remove through a mount that is still there.
		if left, merr := volumes.MountsUnder(dir, ""); merr != nil || len(left) > 0 {
			errs = append(errs, fmt.Errorf("%s kept: mounts left under it (%v)", dir, merr))
		} else {
			errs = append(errs, os.RemoveAll(dir))
		}
		err = errors.Join(append([]error{err}, errs...)...)
	}()
	pg, err := devstack.StartPostgres(ctx, filepath.Join(dir, "pg"), devstack.PostgresOptions{})
	if err != nil {
		return err
	}
	defer pg.Stop()
	if err := pg.CreateDatabase(ctx, "filer"); err != nil {
		return err
	}
	c, err := seaweed.StartCluster(ctx, seaweed.ClusterOptions{Bin: weed, Dir: filepath.Join(dir, "sw"),
		Postgres: seaweed.PostgresStore{Host: pg.Host, Port: pg.Port, User: pg.User, Password: pg.Password, Database: "filer"}})
	if err != nil {
		return err
	}
	defer c.Stop()
	// Secured as in production: the mount's TLS and read tokens are part
	// of what is measured.
	sec, err := c.Security()
	if err != nil {
		return err
	}
	creds, err := sec.MountCredentials()
	if err != nil {
		return err
	}
	d := seaweedfs.New(seaweedfs.Config{Bin: weed, FilerAddr: c.FilerAddr(), FilerURL: c.FilerURL(), FilerKeys: sec.FilerKeys(),
		Env: creds.Env(), StateDir: filepath.Join(dir, "state")})
	mnt, mnt2 := filepath.Join(dir, "mnt"), filepath.Join(dir, "mnt2")
	// Unmounted before the cluster stops (deferred calls run last first).
	defer func() {
		// The driver removes each mount's control socket too.
		if _, uerr := d.UnmountAll(bg, dir); uerr != nil {
			err = errors.Join(err, uerr)
		}
	}()
	v := volumes.Volume{ID: "vol_bench", Workspace: "ws_bench"}
	if err := d.Create(ctx, v); err != nil {
		return err
	}
	if err := d.Mount(ctx, v, mnt, volumes.MountOptions{}); err != nil {
		return err
	}
	local := filepath.Join(dir, "local")
	if err := os.MkdirAll(local, 0o755); err != nil {
		return err
	}
	src := filepath.Join(dir, "src")
	size := int64(sizeMiB) << 20
	if err := randomFile(src, size); err != nil {
		return err
	}
	if b, err = newBundle(ctx, filepath.Join(dir, "bundle")); err != nil {
		return err
	}
	binds := func(vol string, ro bool) []sandbox.Mount {
		return []sandbox.Mount{{Source: vol, Destination: "/vol", ReadOnly: ro}, {Source: local, Destination: "/local"}, {Source: src, Destination: "/src", ReadOnly: true}}
	}
	empty, err := b.empty(ctx, binds(mnt, false), 3)
	if err != nil {
		return err
	}

	r := runner{ctx: ctx, b: b}
	// /src is read through once before the clock starts: the copy reads it
	// from memory on both sides.
	write := func(at string) phase {
		return phase{name: "write " + at, mounts: binds(mnt, false), setup: "cat /src > /dev/null",
			work: fmt.Sprintf("dd if=/src of=%s/big bs=1M count=%d iflag=fullblock conv=fsync", at, sizeMiB)}
	}
	read := func(at string) string {
		return fmt.Sprintf("dd if=%s/big of=/dev/null bs=1M iflag=fullblock", at)
	}
	// A 1 KiB string made by doubling, then one echo per file: both are
	// shell builtins, so the loop forks nothing.
	creates := func(at string) phase {
		return phase{name: "creates " + at, mounts: binds(mnt, false),
			setup: "s=x; for _ in 1 2 3 4 5 6 7 8 9 10; do s=$s$s; done; mkdir -p " + at + "/small",
			work:  fmt.Sprintf(`i=0; while [ $i -lt %d ]; do echo -n "$s" > %s/small/f$i; i=$((i+1)); done`, files, at)}
	}
	lw := r.dd(write("/local"), sizeMiB, filepath.Join(local, "big"), size)
	vw := r.dd(write("/vol"), sizeMiB, filepath.Join(mnt, "big"), size)
	lr := r.dd(phase{name: "read /local", mounts: binds(mnt, false), work: read("/local"),
		before: func() error { return dropPages(filepath.Join(local, "big")) }}, sizeMiB, "", 0)
	// A fresh mount: nothing of the file in its caches or the kernel's.
	if r.err == nil {
		r.err = d.Mount(ctx, v, mnt2, volumes.MountOptions{ReadOnly: true})
	}
	vr := r.dd(phase{name: "read /vol", mounts: binds(mnt2, true), work: read("/vol")}, sizeMiB, "", 0)
	lc := r.creates(creates("/local"), files, filepath.Join(local, "small"))
	vc := r.creates(creates("/vol"), files, filepath.Join(mnt, "small"))
	if r.err != nil {
		return r.err
	}

	fmt.Printf("inside a task: busybox in a hardened runc container (seccomp enforced), one per phase, /vol the volume's FUSE mount, /local a directory on the node's disk\n")
	fmt.Printf("timed from the host between the task's ready and done lines; the container's start and stop are left out (an empty runc run of the bundle: %d ms, median of 3)\n", empty.Milliseconds())
	fmt.Printf("write MiB/s (dd conv=fsync, %d MiB): volume %.1f (%.2f s), local %.1f (%.2f s)\n", sizeMiB, vw.rate, vw.secs, lw.rate, lw.secs)
	fmt.Printf("read MiB/s (cold, dd): volume %.1f (%.2f s), local %.1f (%.2f s)\n", vr.rate, vr.secs, lr.rate, lr.secs)
	fmt.Printf("small-file creates/s (sh loop, %d files of 1 KiB): volume %.0f (%.2f s), local %.0f (%.2f s)\n", files, vc.rate, vc.secs, lc.rate, lc.secs)
	fmt.Printf("write_vs_local=%.3f read_vs_local=%.3f creates_per_s=%.0f creates_vs_local=%.3f\n", vw.rate/lw.rate, vr.rate/lr.rate, vc.rate, vc.rate/lc.rate)
	return nil
}

// runner runs phases until the first error, which it keeps.
type runner struct {
	ctx context.Context
	b   *bundle
	err error
}

// figure is one phase's result: its seconds and its rate (MiB or files
// per second).
type figure struct{ secs, rate float64 }

// dd runs a phase whose work is one dd of n MiB, checks dd copied every
// block and, for a write, that the host sees the whole file at path.
func (r *runner) dd(p phase, n int, path string, size int64) figure {
	if r.err != nil {
		return figure{}
	}
	took, stderr, err := r.b.run(r.ctx, p)
	if err == nil && !strings.Contains(stderr, fmt.Sprintf("%d+0 records out", n)) {
		err = fmt.Errorf("%s: dd did not copy %d MiB: %s", p.name, n, strings.TrimSpace(stderr))
	}
	if err == nil && path != "" {
		if fi, serr := os.Stat(path); serr != nil {
			err = serr
		} else if fi.Size() != size {
			err = fmt.Errorf("%s: %s has %d bytes, want %d", p.name, path, fi.Size(), size)
		}
	}
	if err != nil {
		r.err = err
		return figure{}
	}
	return figure{took.Seconds(), float64(n) / took.Seconds()}
}

// creates runs a phase that creates n files and checks the host sees them
// in dir.
func (r *runner) creates(p phase, n int, dir string) figure {
	if r.err != nil {
		return figure{}
	}
	took, _, err := r.b.run(r.ctx, p)
	if err == nil {
		var ents []os.DirEntry
		if ents, err = os.ReadDir(dir); err == nil && len(ents) != n {
			err = fmt.Errorf("%s: %d files in %s, want %d", p.name, len(ents), dir, n)
		}
	}
	if err != nil {
		r.err = err
		return figure{}
	}
	return figure{took.Seconds(), float64(n) / took.Seconds()}
}

// randomFile writes size random bytes to path: what the tasks copy, so
// neither side can compress it.
func randomFile(path string, size int64) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.CopyN(f, rand.Reader, size); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// dropPages drops the page cache of the file at path.
func dropPages(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		return fmt.Errorf("dropping the cache of %s: %w", path, err)
	}
	return nil
}
