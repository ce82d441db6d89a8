// Package layer owns turning the result of an image build step into an OCI
// layer and appending layers to an image, reproducibly: FromUpper writes the
// tar of an overlayfs upper directory (overlay whiteouts and opaque
// directories become OCI whiteouts), FromCopy writes the tar of a copy step
// from a client's source tar, Layer gzips a tar deterministically, and
// Append adds layers and config changes to a parent image. Equal inputs give
// byte-identical tars and equal layer and image digests: entries are sorted,
// times set to one epoch, user and group names left empty, gzip headers
// carry no time or name, and history and config times are the epoch.
//
// It must never: follow a symlink in the upper directory, or leave it (every
// lookup is an openat2 with RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS|
// RESOLVE_NO_XDEV, so a mount or link planted by the build cannot redirect a
// read); read anything but its inputs (the upper directory, the source tar,
// the tar file it is given, the parent image); emit an entry at or below an
// excluded path (the mount points the sandbox makes); emit a device node (an
// overlay whiteout becomes a ".wh." file, any other device is refused with
// an error naming it); carry overlayfs bookkeeping (trusted.overlay.* and
// user.overlay.* xattrs) or security.selinux labels into a layer; accept an
// upper directory written with overlay's redirect_dir or metacopy features
// (the diff would be incomplete; it refuses them by name); accept a copy
// entry with "..", an absolute name, or a hard link to something outside its
// tar. It knows nothing of the controlplane, the agent or the API: callers
// hand it directories, streams and images.
//
// Layer digests depend on the gzip implementation of the Go toolchain that
// built the binary; diff IDs (the uncompressed tar digests) depend only on
// the inputs. Two agents on one release give equal digests.
//
// API stability: experimental; the recipe builder (issue 21) is its first
// user.
package layer
