#!/usr/bin/env bash
# Regenerates the replace block of packaging/kube/go.mod from the kubernetes
# go.mod in the module cache: every k8s.io/* staging module (which upstream
# points at ./staging/...) becomes the published module of the same release.
# k8s.io/sample-cli-plugin is left out: it has no published version.
# Run it when bumping KUBE_VERSION, then `go mod tidy` in this directory.
set -euo pipefail
cd "$(dirname "$0")"
export GOFLAGS="${GOFLAGS:--mod=mod}"
KUBE_VERSION="${KUBE_VERSION:-v1.36.3}"
STAGING_VERSION="v0${KUBE_VERSION#v1}"
mod="$(go mod download -json "k8s.io/kubernetes@${KUBE_VERSION}" | sed -n 's/.*"GoMod": "\(.*\)",/\1/p')"
{
  echo "replace ("
  grep -E '^\s*k8s\.io/[^ ]+ => \./staging/' "$mod" | awk '{print $1}' | grep -v '^k8s.io/sample-cli-plugin$' | sort |
    while read -r name; do printf '\t%s => %s %s\n' "$name" "$name" "$STAGING_VERSION"; done
  echo ")"
} >replaces.tmp
# Swap the old block (from "replace (" to its ")") for the new one.
awk -v f=replaces.tmp 'BEGIN{while((getline l < f)>0) blk=blk l "\n"}
  /^replace \($/ {skip=1; printf "%s", blk; next}
  skip && /^\)$/ {skip=0; next}
  !skip {print}' go.mod >go.mod.tmp
mv go.mod.tmp go.mod
rm -f replaces.tmp
