package volumes

import (
	"context"
	"errors"
	"io"
	"time"
)

// Volume identifies one volume to a driver. The driver derives everything
// it stores (a filer directory, a collection) from ID and Workspace, never
// from Name, so a rename or a name reused after delete never aliases data.
type Volume struct {
	// ID is the volume's stable id ("vol_..."); only [a-z0-9_-].
	ID string
	// Workspace is the owning workspace's id.
	Workspace string
	// Name is the user's name for it, for messages only.
	Name string
	// QuotaBytes caps what it holds; zero is no cap.
	QuotaBytes int64
}

// Stats are what a volume holds now.
type Stats struct {
	Bytes uint64
	Files uint64
	Dirs  uint64
}

// MountOptions are per mount, not per volume.
type MountOptions struct {
	ReadOnly bool
	// Env is this mount's credentials and settings for the driver's
	// helper process (KEY=VALUE, the driver's own keys), as the attempt
	// that mounts it brought them; never logged.
	Env []string
}

// Driver is one filesystem behind volumes. A volume's life:
//
//	Create ──▶ Mount(target) ⇄ Unmount(target) ──▶ Delete
//	   Stats at any time after Create
//
// The contract:
//
//   - Create and Delete are idempotent (creating an existing volume or
//     deleting a missing one is not an error); Delete removes the data.
//   - Mount blocks until target is a mounted filesystem (or fails and
//     leaves nothing mounted); a mount is supervised by the driver and
//     remounted if its process dies, until Unmount.
//   - Unmount blocks until target is no longer mounted; unmounting what is
//     not mounted is not an error.
//   - All methods are safe for concurrent use on different targets.
//   - Credentials reach helper processes through their environment or a
//     0600 file, never argv, and never appear in errors.
type Driver interface {
	// Name is the driver's name as volumes record it ("seaweedfs").
	Name() string
	Create(ctx context.Context, v Volume) error
	Delete(ctx context.Context, v Volume) error
	Stats(ctx context.Context, v Volume) (Stats, error)
	Mount(ctx context.Context, v Volume, target string, opts MountOptions) error
	Unmount(ctx context.Context, target string) error
}

// Reconciler is a driver that can find and remove the mounts a killed
// agent left under root (an optional ability of a Driver).
type Reconciler interface {
	// UnmountAll unmounts every mount of this driver under root and
	// returns the targets it unmounted.
	UnmountAll(ctx context.Context, root string) ([]string, error)
}

// ErrFull is returned (wrapped) by Files.PutFile for a file that would
// take the volume past its quota.
var ErrFull = errors.New("volume is full")

// FileInfo is one entry of a volume.
type FileInfo struct {
	// Path is relative to the volume's root, with a leading "/".
	Path    string
	Dir     bool
	Size    uint64
	ModTime time.Time
}

// Files is a driver that can read and write a volume's files without
// mounting it (an optional ability of a Driver). Paths are CleanFilePath's
// output; a missing one is errdefs.ErrNotFound.
type Files interface {
	// ListFiles lists the directory at p, or returns the one entry of the
	// file at p.
	ListFiles(ctx context.Context, v Volume, p string) ([]FileInfo, error)
	// OpenFile opens the file at p for reading; the caller closes it.
	OpenFile(ctx context.Context, v Volume, p string) (io.ReadCloser, error)
	// PutFile writes r to the file at p, creating its parents. The file
	// shows under p only once r is read to its end: a failure (r's error,
	// ErrFull past the quota) leaves no file under p and none elsewhere.
	PutFile(ctx context.Context, v Volume, p string, r io.Reader) (FileInfo, error)
	// RemoveFile removes the file at p, or the directory at p when
	// recursive is set.
	RemoveFile(ctx context.Context, v Volume, p string, recursive bool) error
}
