#!/usr/bin/env bash
# Builds levers9's test Kubernetes control plane from the Go module proxy:
# kube-apiserver, kube-controller-manager, kube-scheduler (k8s.io/kubernetes
# v1.36.3 in this directory's module), etcd (./etcd over etcd's embed
# package) and kwok (./kwok, a module of its own), plus kwok's stages.yaml.
#
# The binaries are cached in ${XDG_CACHE_HOME:-$HOME/.cache}/levers9/kube/KEY/
# where KEY hashes everything that made them (this script, both go.mod and
# go.sum files, the etcd main, stages.yaml and `go version`); a warm run only
# hashes and returns. A build goes to a temporary directory renamed into
# place when complete, so a killed build leaves nothing half-made. Builds are
# serialised with a lock so a test and `make test` never build twice at once.
#
# Prints the directory as the last line of stdout; progress goes to stderr.
# Cold: ~10-30 minutes on 2 cores, and ~4.5 GB more in Go's build cache.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here"
export GOFLAGS=-mod=readonly # the key hashes go.mod: the build must not rewrite it

KUBE_VERSION=v1.36.3
inputs=(build.sh go.mod go.sum etcd/main.go kwok/go.mod kwok/go.sum kwok/stages.yaml)
key="$( { sha256sum "${inputs[@]}"; go version; } | sha256sum | cut -c1-16)"
root="${XDG_CACHE_HOME:-$HOME/.cache}/levers9/kube"
out="$root/$key"
bins=(kube-apiserver kube-controller-manager kube-scheduler etcd kwok stages.yaml)

complete() {
  local b
  for b in "${bins[@]}"; do [ -s "$out/$b" ] || return 1; done
}

if complete; then echo "$out"; exit 0; fi

mkdir -p "$root"
exec 9>"$root/.lock"
flock 9
if complete; then echo "$out"; exit 0; fi # another build finished while we waited

# Leftovers of killed builds: nobody else holds the lock, so they are stale.
rm -rf "$root"/.tmp-* "$out"
tmp="$root/.tmp-$key-$$"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp"

ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$KUBE_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=36 -X k8s.io/component-base/version.gitTreeState=clean"
start=$SECONDS
echo "kube: building the control plane $KUBE_VERSION into $out (cold: 10-30 minutes)" >&2
go build -trimpath -ldflags "$ldflags" -o "$tmp/" \
  k8s.io/kubernetes/cmd/kube-apiserver \
  k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kube-scheduler \
  ./etcd >&2
echo "kube: apiserver, controller manager, scheduler, etcd built ($((SECONDS - start)) s); building kwok" >&2
(cd kwok && go build -trimpath -ldflags "-s -w" -o "$tmp/" sigs.k8s.io/kwok/cmd/kwok) >&2
cp kwok/stages.yaml "$tmp/stages.yaml"
chmod 0755 "$tmp"
mv -T "$tmp" "$out"
trap - EXIT
echo "kube: built in $((SECONDS - start)) s" >&2
echo "$out"
