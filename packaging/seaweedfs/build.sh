#!/usr/bin/env bash
# Builds the `weed` binary levers9 runs for volumes (SeaweedFS master, volume
# server, filer and FUSE mount) from the Go module proxy, at the version this
# directory's go.mod pins (github.com/seaweedfs/seaweedfs, `weed version` 4.53).
#
# The binary is cached in ${XDG_CACHE_HOME:-$HOME/.cache}/levers9/seaweedfs/
# VERSION-KEY/weed where KEY hashes everything that made it (this script,
# go.mod, go.sum and `go version`); a warm run only hashes and prints. A build
# goes to a temporary directory renamed into place when complete, so a killed
# build leaves nothing half-made, and builds are serialised with a lock.
#
# Prints the binary's path as the last line of stdout; progress goes to stderr.
# Cold: ~7-10 minutes on 2 busy cores and a ~230 MB binary.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here"
export GOFLAGS=-mod=readonly # the key hashes go.mod: the build must not rewrite it

version="$(awk '$1 == "github.com/seaweedfs/seaweedfs" { print $2; exit }' go.mod)"
[ -n "$version" ] || { echo "seaweedfs: no github.com/seaweedfs/seaweedfs version in go.mod" >&2; exit 1; }
key="$( { sha256sum build.sh go.mod go.sum; go version; } | sha256sum | cut -c1-16)"
root="${XDG_CACHE_HOME:-$HOME/.cache}/levers9/seaweedfs"
out="$root/$version-$key"

if [ -x "$out/weed" ]; then echo "$out/weed"; exit 0; fi

mkdir -p "$root"
exec 9>"$root/.lock"
flock 9
if [ -x "$out/weed" ]; then echo "$out/weed"; exit 0; fi # built while we waited

# Leftovers of killed builds: nobody else holds the lock, so they are stale.
rm -rf "$root"/.tmp-* "$out"
tmp="$root/.tmp-$key-$$"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp"

start=$SECONDS
echo "seaweedfs: building weed $version into $out (cold: 7-10 minutes)" >&2
go build -trimpath -ldflags "-s -w" -o "$tmp/weed" github.com/seaweedfs/seaweedfs/weed >&2
chmod 0755 "$tmp"
mv -T "$tmp" "$out"
trap - EXIT
echo "seaweedfs: built in $((SECONDS - start)) s" >&2
echo "$out/weed"
