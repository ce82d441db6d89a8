#!/usr/bin/env bash
# make release: builds the release binaries into dist/ (flat), with the
# version and commit stamped in (internal/version), and writes SHA256SUMS
# and VERSION beside them:
#
#   dist/levers9-linux-{amd64,arm64}               the CLI, static (no cgo)
#   dist/levers9-controlplane-linux-{amd64,arm64}  static (no cgo)
#   dist/levers9-dashboard-api-linux-{amd64,arm64} static (no cgo)
#   dist/levers9-agent-linux-{amd64,arm64}         cgo, so go-nvml can dlopen
#                                                  libnvidia-ml (dynamic glibc)
#   dist/SHA256SUMS                                sha256sum format
#   dist/VERSION                                   the stamped version, one line
#
# The agent names are the ones controlplane/agentdist serves, so the
# controlplane image can carry dist/levers9-agent-linux-* as they are.
#
# Environment:
#   VERSION=v1.2.3  the version to stamp (default: git describe --tags --always --dirty)
#   DIST=DIR        where to write (default: dist; a relative DIR is taken from the
#                   repository's top, where the script runs)
#   ONLY=amd64      build only these architectures (comma-separated; default amd64,arm64)
#   ARM64_NVML=0    build the arm64 agent without cgo, so without NVML (GPUs are not
#                   reported), when Debian's cross compiler cannot be had; the default
#                   installs gcc-aarch64-linux-gnu and fails if it cannot
#
# Reproducible: -trimpath, -buildvcs=false, stripped, no build ID and no
# build time (the commit's own time is stamped), so two runs on one commit
# with one Go toolchain write the same SHA256SUMS.
set -euo pipefail
cd "$(dirname "$0")/../.."
export GOFLAGS="${GOFLAGS:--mod=mod}"
export LC_ALL=C

log() { echo "release: $*" >&2; }

if ! git rev-parse --git-dir >/dev/null 2>&1; then
  log "not a git checkout: the version and commit come from git"; exit 1
fi
VERSION="${VERSION:-$(git describe --tags --always --dirty)}"
COMMIT="$(git rev-parse HEAD)"
COMMIT_TIME="$(TZ=UTC git show -s --date=format-local:%Y-%m-%dT%H:%M:%SZ --format=%cd HEAD)"
DIST="${DIST:-dist}"
IFS=, read -r -a ARCHES <<<"${ONLY:-amd64,arm64}"
HOST_ARCH="$(go env GOHOSTARCH)"

for a in "${ARCHES[@]}"; do
  case "$a" in amd64|arm64) ;; *) log "ONLY: unknown architecture $a (amd64, arm64)"; exit 1 ;; esac
done

# install_pkgs installs the Debian packages that are missing, like
# packaging/dev/deps.sh: nothing happens when all are there.
install_pkgs() {
  local missing=() p
  for p in "$@"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
      missing+=("$p")
    fi
  done
  ((${#missing[@]})) || return 0
  log "installing ${missing[*]}"
  local sudo=""
  if [ "$(id -u)" != 0 ]; then sudo=sudo; fi
  # Output to stderr: agent_cc's stdout is the compiler's name.
  $sudo apt-get update -qq >&2 &&
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
}

# agent_cc prints the C compiler for the agent of arch $1, installing
# Debian's cross compiler when arch is not the host's.
agent_cc() {
  local arch="$1" triple pkgs
  if [ "$arch" = "$HOST_ARCH" ]; then
    install_pkgs gcc libc6-dev || return 1
    echo gcc; return 0
  fi
  case "$arch" in
    arm64) triple=aarch64-linux-gnu; pkgs=(gcc-aarch64-linux-gnu libc6-dev-arm64-cross) ;;
    amd64) triple=x86_64-linux-gnu; pkgs=(gcc-x86-64-linux-gnu libc6-dev-amd64-cross) ;;
  esac
  install_pkgs "${pkgs[@]}" || return 1
  echo "$triple-gcc"
}

PKG=github.com/levers9/levers9/internal/version
LDFLAGS="-s -w -buildid= -X $PKG.Version=$VERSION -X $PKG.Commit=$COMMIT -X $PKG.CommitTime=$COMMIT_TIME"

# build NAME ARCH CGO [CC]: one binary into $DIST/NAME-linux-ARCH, written
# under a temporary name first so a failed build leaves no half file.
build() {
  local name="$1" arch="$2" cgo="$3" cc="${4:-}" out="$DIST/$1-linux-$2"
  local start=$SECONDS
  log "building $name linux/$arch (cgo=$cgo${cc:+, CC=$cc})"
  # go-nvml's header marks much of the NVML API deprecated; its cgo
  # prologue warns about each such symbol, which says nothing about us.
  CGO_ENABLED="$cgo" CC="${cc:-gcc}" CGO_CFLAGS="-O2 -Wno-deprecated-declarations" GOOS=linux GOARCH="$arch" \
    go build -trimpath -buildvcs=false -ldflags "$LDFLAGS" -o "$out.tmp" "./cmd/$name"
  mv -f "$out.tmp" "$out"
  log "built $out in $((SECONDS - start))s"
}

mkdir -p "$DIST"
# A flat dist holds one release: binaries of an earlier run (another
# version, or an architecture this run skips) would otherwise be summed too.
rm -f "$DIST"/levers9-linux-* "$DIST"/levers9-controlplane-linux-* "$DIST"/levers9-agent-linux-* \
  "$DIST"/levers9-dashboard-api-linux-* \
  "$DIST"/*.tmp "$DIST/SHA256SUMS" "$DIST/VERSION"

log "version $VERSION, commit $COMMIT ($COMMIT_TIME), into $DIST"
for arch in "${ARCHES[@]}"; do
  build levers9 "$arch" 0
  build levers9-controlplane "$arch" 0
  build levers9-dashboard-api "$arch" 0
  if [ "$arch" = arm64 ] && [ "${ARM64_NVML:-1}" = 0 ]; then
    log "WARNING: the arm64 agent is built without cgo (ARM64_NVML=0): it cannot load NVML and reports no GPUs"
    build levers9-agent "$arch" 0
    continue
  fi
  if ! cc="$(agent_cc "$arch")"; then
    log "cannot install the C compiler for the linux/$arch agent (needed for NVML);"
    log "run with ARM64_NVML=0 to build the arm64 agent without NVML"
    exit 1
  fi
  build levers9-agent "$arch" 1 "$cc"
done

(cd "$DIST" && sha256sum levers9*-linux-* >SHA256SUMS)
printf '%s\n' "$VERSION" >"$DIST/VERSION"
log "wrote $DIST/SHA256SUMS and $DIST/VERSION"
