// Package volumes owns levers9's volumes as the node and the controlplane
// see them: the Driver interface every filesystem implements (create,
// mount on a node, unmount, delete, stats), the rules for volume names,
// container paths and sizes, and the helpers to find FUSE mounts a killed
// agent left behind. Drivers live below it (volumes/seaweedfs, the tested
// one; volumes/juicefs, argv and environment only).
//
// It never puts a credential in a process's argv or an error message, and
// knows nothing of the store, the API or the tunnel. Its API is internal
// to levers9 and may change.
package volumes
