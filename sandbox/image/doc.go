// Package image owns the node's content-addressed image cache: it resolves a
// reference against the configured registry, verifies the sha256 of every
// blob (manifest, config, layers) while downloading, keeps blobs under
// blobs/sha256/<hex>, unpacks each image exactly once into a read-only lower
// directory rootfs/<hex>, and gives every task its own overlayfs mount whose
// upper and work directories belong to that task alone. Least-recently-used
// images above a disk budget are garbage-collected, never one that is
// mounted.
//
// On-disk layout under Config.Root (dirs 0755, files 0644, except rootfs/,
// tasks/ and tmp/, which are 0700 so no host user but root can reach an
// image's setuid binaries):
//
//	blobs/sha256/<hex>   verified blobs, written to tmp/ then renamed
//	rootfs/<hex>         unpacked lower dir; exists only when complete
//	images/<hex>.json    record of a complete image; mtime = last use
//	refs/<hex>.json      tag or index digest -> image digest (offline pulls)
//	locks/<hex>.lock     flock serialising processes on one digest
//	tasks/<id>/          upper, work and rootfs (the overlay mount) of a task
//	tmp/                 partial downloads and unpacks, removed by Reconcile
//
// It must never: write into a lower directory after it was renamed into
// place; follow a symlink while unpacking (every entry is resolved with
// openat2 RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS); create device nodes; speak
// plain HTTP to a registry not listed in Config.InsecureRegistries; contact a
// registry that is not configured; log, store or return credentials; serve
// a cached image that needed a login to a pull by digest before the registry
// accepted that pull's own credentials (records mark such images private;
// only Config.Offline skips the check). It knows nothing of the
// controlplane: credentials arrive through Keychain, the store's own or one
// pull's (PullWith).
//
// API stability: experimental. Store, Image, ImageConfig, Keychain and the
// Mount contract are what the agent builds on; on-disk layout may change
// between releases (the cache can always be dropped and refilled).
package image
