#!/usr/bin/env bash
# deploy.sh installs or upgrades the levers9 chart with the object-store keys kept out of the tree.
#
#   packaging/deploy/deploy.sh [HELM FLAGS...]     e.g. -f packaging/eks/values.yaml --wait
#
# Keys come from files under ~/.levers9 named by these variables (a bare name is taken in
# ~/.levers9; each file has ACCESS_KEY_ID=... and SECRET_ACCESS_KEY=... lines):
#   LEVERS9_IMAGES_KEYS     -> objectStore.images.{accessKeyId,secretAccessKey}    (the registry's object store)
#   LEVERS9_JUICEFS_KEYS    -> objectStore.juicefs.{accessKeyId,secretAccessKey}   (volumes)
#   LEVERS9_WORKSPACE_KEYS  -> objectStore.workspace.{accessKeyId,secretAccessKey} (workspace storage)
# An unset variable leaves its values alone. The keys go into a temporary values file readable by
# this user only (0600), removed when helm is done, fails, or on Ctrl-C; never into argv.
#
# Also read: LEVERS9_RELEASE (default levers9), LEVERS9_NAMESPACE (default levers9),
# LEVERS9_CHART (default the chart beside this script), HELM (default helm).
set -euo pipefail

release=${LEVERS9_RELEASE:-levers9}
namespace=${LEVERS9_NAMESPACE:-levers9}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
chart=${LEVERS9_CHART:-$here/../helm/levers9}
helm=${HELM:-helm}
keydir=${HOME:?HOME is not set}/.levers9

fail() { printf 'deploy.sh: %s\n' "$*" >&2; exit 1; }

values=""
child=""
cleanup() {
  if [ -n "$values" ]; then rm -f -- "$values"; fi
}
on_signal() {
  # The child may not have seen the signal (it was sent to this script only): stop it too.
  if [ -n "$child" ]; then kill -TERM "$child" 2>/dev/null || true; wait "$child" 2>/dev/null || true; fi
  cleanup
  trap - EXIT
  exit "$1"
}
trap cleanup EXIT
trap 'on_signal 130' INT
trap 'on_signal 143' TERM
trap 'on_signal 129' HUP

# yaml_quote prints a YAML single-quoted scalar ('' stands for a quote inside).
yaml_quote() { printf "'%s'" "${1//\'/\'\'}"; }

# read_keys FILE VAR_NAME STORE: appends STORE's keys from FILE to the values file. Errors name the
# file and the key, never a value.
read_keys() {
  local file=$1 var=$2 store=$3 id="" secret="" line k v n=0
  case $file in
    /*) ;;
    *) file=$keydir/$file ;;
  esac
  [ -f "$file" ] || fail "$var names $file, which is not a file"
  [ -r "$file" ] || fail "$var names $file, which this user cannot read"
  if [ -n "$(find "$file" -maxdepth 0 -perm /077 2>/dev/null)" ]; then
    printf 'deploy.sh: warning: %s is readable by others (chmod 600 it)\n' "$file" >&2
  fi
  while IFS= read -r line || [ -n "$line" ]; do
    n=$((n + 1))
    line=${line%$'\r'}
    case $line in ''|'#'*) continue ;; esac
    k=${line%%=*}
    v=${line#*=}
    [ "$k" != "$line" ] || fail "$file:$n: not KEY=VALUE"
    k=${k#export }
    case $k in
      ACCESS_KEY_ID) id=$v ;;
      SECRET_ACCESS_KEY) secret=$v ;;
      *) fail "$file:$n: unknown key $k (want ACCESS_KEY_ID and SECRET_ACCESS_KEY)" ;;
    esac
  done < "$file"
  [ -n "$id" ] || fail "$file: ACCESS_KEY_ID is missing or empty"
  [ -n "$secret" ] || fail "$file: SECRET_ACCESS_KEY is missing or empty"
  {
    printf '  %s:\n' "$store"
    printf '    accessKeyId: %s\n' "$(yaml_quote "$id")"
    printf '    secretAccessKey: %s\n' "$(yaml_quote "$secret")"
  } >> "$values"
}

umask 077
values=$(mktemp "${TMPDIR:-/tmp}/levers9-values.XXXXXXXX")
chmod 600 "$values"
printf '# written by deploy.sh; removed when helm is done\nobjectStore:\n' > "$values"
stores=0
for pair in LEVERS9_IMAGES_KEYS:images LEVERS9_JUICEFS_KEYS:juicefs LEVERS9_WORKSPACE_KEYS:workspace; do
  var=${pair%%:*}
  if [ -n "${!var:-}" ]; then
    read_keys "${!var}" "$var" "${pair#*:}"
    stores=$((stores + 1))
  fi
done
if [ "$stores" = 0 ]; then
  printf 'objectStore: {}\n' > "$values"
fi
printf 'deploy.sh: helm upgrade --install %s (namespace %s, %d object-store key file(s))\n' "$release" "$namespace" "$stores" >&2

# helm runs in the background so a signal reaches the trap at once, not when helm exits.
"$helm" upgrade --install "$release" "$chart" --namespace "$namespace" --create-namespace \
  --values "$values" "$@" &
child=$!
set +e
wait "$child"
status=$?
set -e
child=""
exit "$status"
