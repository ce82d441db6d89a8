#!/usr/bin/env bash
# Builds and installs the pinned gVisor runsc that levers9 uses for runsc
# pools. Debian's runsc (2022) cannot give a container networking on recent
# kernels: it takes /proc/sys/net/core/rmem_default, which 6.x kernels show in
# every network namespace, as proof it runs in the root one, and refuses.
#
# The version is the one packaging/runsc/go.mod pins. The build (about 100 MB,
# a few minutes) is cached in ~/.cache/levers9/runsc/<version>/runsc, so only
# the first run on a machine pays; the binary is then installed as
# /usr/local/lib/levers9/runsc (LEVERS9_RUNSC_DIR), where the agent looks
# first (agent --runsc). Debian's /usr/bin/runsc is left alone.
# Idempotent: does nothing when the installed binary already reports the
# pinned version.
set -euo pipefail
cd "$(dirname "$0")/../runsc"

version="$(GOFLAGS=-mod=readonly go list -m -f '{{.Version}}' gvisor.dev/gvisor)"
dest_dir="${LEVERS9_RUNSC_DIR:-/usr/local/lib/levers9}"
dest="$dest_dir/runsc"

reports_version() {
  local out
  [ -x "$1" ] && out="$("$1" --version 2>/dev/null)" && [[ "$out" == "runsc version $version"* ]]
}

if reports_version "$dest"; then
  exit 0
fi

cache="${XDG_CACHE_HOME:-$HOME/.cache}/levers9/runsc/$version"
if ! reports_version "$cache/runsc"; then
  echo "deps: building gVisor runsc $version (once per machine, a few minutes)" >&2
  mkdir -p "$cache"
  CGO_ENABLED=0 GOFLAGS=-mod=readonly go build -trimpath \
    -ldflags "-s -w -X gvisor.dev/gvisor/runsc/version.version=$version" \
    -o "$cache/runsc.tmp" gvisor.dev/gvisor/runsc
  mv "$cache/runsc.tmp" "$cache/runsc"
fi

SUDO=""
if [ "$(id -u)" != 0 ] && [ ! -w "$dest_dir" ]; then SUDO=sudo; fi
$SUDO mkdir -p "$dest_dir"
$SUDO install -m 0755 "$cache/runsc" "$dest.tmp"
$SUDO mv "$dest.tmp" "$dest"
echo "deps: installed gVisor runsc $version as $dest" >&2
