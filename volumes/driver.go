package volumes

import "context"

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
