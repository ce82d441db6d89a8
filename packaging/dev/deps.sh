#!/usr/bin/env bash
# Installs the Debian packages levers9's local stack and tests need.
# Idempotent: only missing packages are installed, and apt's lists are
# refreshed only when something is missing.
set -euo pipefail

PKGS=(
  postgresql redis-server runc runsc iptables iproute2 conntrack
  docker-registry protobuf-compiler busybox-static podman
  golang-github-gogo-googleapis-dev ca-certificates openssl curl
  chromium gcc libc6-dev fuse3
)

# The dashboard's web app (Next.js 16) needs Node.js 20.9 or later and npm.
# The machines levers9 is developed and tested on come with Node.js 20;
# where node is missing, Debian's is installed, but bookworm's is 18, which
# the web build (dashboard/web/web.go) refuses with a message saying so.
for tool in node npm; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    case "$tool" in node) PKGS+=(nodejs) ;; npm) PKGS+=(npm) ;; esac
  fi
done

missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  echo "deps: installing ${missing[*]}" >&2
  SUDO=""
  if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The gVisor runsc levers9 pins (Debian's is too old for 6.x kernels):
# built once per machine, cached under ~/.cache/levers9/runsc/.
bash "$(dirname "$0")/runsc.sh"

# Debian starts system-wide postgres and redis on install; levers9 runs its
# own in private data dirs on free ports, so the system ones are not needed.
# Leave them alone if they are running: they do not collide with our ports.
exit 0
