package enroll

import (
	"bytes"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"text/template"
	"time"
)

// ScriptParams fill a join script.
type ScriptParams struct {
	MachineID string
	Pool      string
	// ControlplaneGRPC is HOST:PORT of the controlplane's gRPC API.
	ControlplaneGRPC string
	// ControlplaneREST is the https:// base URL agents are downloaded from.
	ControlplaneREST string
	// CAPEM is the CA the box trusts for the controlplane (empty: the
	// system's roots).
	CAPEM string
	// AgentSHA256 maps "linux-amd64" and the like to the expected checksum
	// of the prebuilt agent.
	AgentSHA256 map[string]string
	Token       string
	ExpiresAt   time.Time
	// DevBuild makes the script download the controlplane's source build.
	DevBuild bool
}

var (
	safeWord = regexp.MustCompile(`^[A-Za-z0-9._:/\[\]-]+$`)
	hexSum   = regexp.MustCompile(`^[0-9a-f]{64}$`)
)

// JoinScript renders the script an operator runs on a box as root. It
// checks the platform, downloads the agent and verifies its checksum,
// writes the token to a 0600 file (never argv), enrolls, and installs a
// systemd unit or runs in the foreground. Running it twice is harmless. Its
// AGENT_FLOOR line is empty; SetScriptFloor fills it.
func JoinScript(p ScriptParams) (string, error) {
	for name, v := range map[string]string{"machine id": p.MachineID, "pool": p.Pool,
		"controlplane gRPC address": p.ControlplaneGRPC, "controlplane REST URL": p.ControlplaneREST} {
		if !safeWord.MatchString(v) {
			return "", fmt.Errorf("join script: %s %q has characters a script cannot carry", name, v)
		}
	}
	if _, err := ParseJoinToken(p.Token); err != nil {
		return "", fmt.Errorf("join script: %w", err)
	}
	if strings.Contains(p.CAPEM, "L9CAPEM") {
		return "", fmt.Errorf("join script: CA PEM holds the heredoc marker")
	}
	platforms := make([]string, 0, len(p.AgentSHA256))
	for pl, sum := range p.AgentSHA256 {
		if !safeWord.MatchString(pl) || !hexSum.MatchString(sum) {
			return "", fmt.Errorf("join script: bad checksum entry for %q", pl)
		}
		platforms = append(platforms, pl)
	}
	sort.Strings(platforms)
	var b bytes.Buffer
	err := scriptTmpl.Execute(&b, struct {
		ScriptParams
		Platforms []string
		Expires   string
	}{p, platforms, p.ExpiresAt.UTC().Format(time.RFC3339)})
	return b.String(), err
}

var scriptTmpl = template.Must(template.New("join").Parse(`#!/bin/sh
# levers9 join script for machine {{.MachineID}} (pool {{.Pool}}).
# It holds a single-use join token that expires at {{.Expires}}: keep this file private.
# Run it as root on the machine to join:   sh join.sh [--foreground] [--state-dir DIR] [-- AGENT-RUN-FLAGS...]
set -eu

MACHINE_ID='{{.MachineID}}'
POOL='{{.Pool}}'
CONTROLPLANE_GRPC='{{.ControlplaneGRPC}}'
CONTROLPLANE_REST='{{.ControlplaneREST}}'
JOIN_TOKEN='{{.Token}}'
# The machine's security floor (levers9 machine create --min-*): the agent
# refuses tasks whose container security is looser.
AGENT_FLOOR=''
STATE_DIR=/var/lib/levers9-agent
ETC_DIR=/etc/levers9
BIN_DIR=/usr/local/bin
FOREGROUND=0

fail() { echo "levers9 join: $*" >&2; exit 1; }
say() { echo "levers9 join: $*"; }

while [ $# -gt 0 ]; do
  case "$1" in
    --foreground) FOREGROUND=1 ;;
    --state-dir) shift; STATE_DIR="${1:?--state-dir needs a directory}" ;;
    --state-dir=*) STATE_DIR="${1#--state-dir=}" ;;
    --etc-dir) shift; ETC_DIR="${1:?--etc-dir needs a directory}" ;;
    --bin-dir) shift; BIN_DIR="${1:?--bin-dir needs a directory}" ;;
    -h|--help) sed -n '2,4p' "$0"; exit 0 ;;
    --) shift; break ;;
    *) fail "unknown option $1 (try --help)" ;;
  esac
  shift
done
# Whatever follows -- goes to 'levers9-agent run' (e.g. --insecure-registries
# HOST:PORT); each must be one word without quotes or spaces.
AGENT_ARGS="$AGENT_FLOOR"
for a in "$@"; do
  case "$a" in
    *[!A-Za-z0-9._:/,=+-]*) fail "agent option $a: use letters, digits and . _ : / , = + - only" ;;
  esac
  AGENT_ARGS="$AGENT_ARGS $a"
done

[ "$(uname -s)" = Linux ] || fail "levers9 agents run on Linux; this is $(uname -s)"
case "$(uname -m)" in
  x86_64|amd64) PLATFORM=linux-amd64 ;;
  aarch64|arm64) PLATFORM=linux-arm64 ;;
  *) fail "unsupported architecture $(uname -m)" ;;
esac
[ "$(id -u)" = 0 ] || fail "run this as root: the agent starts containers"
command -v curl >/dev/null 2>&1 || fail "curl is needed (apt-get install curl)"
command -v sha256sum >/dev/null 2>&1 || fail "sha256sum is needed (coreutils)"

umask 077
mkdir -p "$ETC_DIR" "$STATE_DIR" "$BIN_DIR"
CURL_CA=""
{{- if .CAPEM}}
cat > "$ETC_DIR/controlplane-ca.pem" <<'L9CAPEM'
{{.CAPEM}}L9CAPEM
CURL_CA="--cacert $ETC_DIR/controlplane-ca.pem"
{{- end}}

if [ -f "$STATE_DIR/machine-id" ] && [ "$(cat "$STATE_DIR/machine-id")" = "$MACHINE_ID" ] && [ -f "$STATE_DIR/agent.crt" ]; then
  say "this machine already joined as $MACHINE_ID; nothing to do"
  ALREADY=1
else
  ALREADY=0
  case "$PLATFORM" in
{{- range .Platforms}}
    {{.}}) WANT_SHA256='{{index $.AgentSHA256 .}}' ;;
{{- end}}
    *) fail "the controlplane has no prebuilt agent for $PLATFORM" ;;
  esac
  say "downloading the agent for $PLATFORM"
  # shellcheck disable=SC2086
  curl -fsS $CURL_CA -o "$STATE_DIR/levers9-agent.download" "$CONTROLPLANE_REST/agent/v1/download/$PLATFORM{{if .DevBuild}}?dev=1{{end}}" \
    || fail "could not download the agent from $CONTROLPLANE_REST"
  echo "$WANT_SHA256  $STATE_DIR/levers9-agent.download" | sha256sum -c - >/dev/null 2>&1 \
    || { rm -f "$STATE_DIR/levers9-agent.download"; fail "the downloaded agent's checksum is wrong; refusing to run it"; }
  chmod 0755 "$STATE_DIR/levers9-agent.download"
  mv -f "$STATE_DIR/levers9-agent.download" "$BIN_DIR/levers9-agent"
  printf '%s' "$JOIN_TOKEN" > "$ETC_DIR/join-token"
  say "enrolling as $MACHINE_ID in pool $POOL"
  CA_ARG=""
  [ -f "$ETC_DIR/controlplane-ca.pem" ] && CA_ARG="--ca-file=$ETC_DIR/controlplane-ca.pem"
  # shellcheck disable=SC2086
  "$BIN_DIR/levers9-agent" join --controlplane "$CONTROLPLANE_GRPC" $CA_ARG \
    --token-file "$ETC_DIR/join-token" --state-dir "$STATE_DIR" \
    || { rm -f "$ETC_DIR/join-token"; fail "enrollment failed (see above)"; }
  rm -f "$ETC_DIR/join-token"
fi

if [ "$FOREGROUND" = 1 ]; then
  say "running the agent in the foreground"
  # shellcheck disable=SC2086
  exec "$BIN_DIR/levers9-agent" run --state-dir "$STATE_DIR" $AGENT_ARGS
fi
if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
  cat > /etc/systemd/system/levers9-agent.service <<L9UNIT
[Unit]
Description=levers9 agent
After=network-online.target
Wants=network-online.target

[Service]
ExecStart=$BIN_DIR/levers9-agent run --state-dir $STATE_DIR$AGENT_ARGS
Restart=always
RestartSec=2
KillMode=process

[Install]
WantedBy=multi-user.target
L9UNIT
  systemctl daemon-reload
  systemctl enable --now levers9-agent.service >/dev/null
  systemctl restart levers9-agent.service
  say "joined; the agent runs as the systemd service levers9-agent"
else
  [ "$ALREADY" = 1 ] && exit 0
  fail "no systemd here: run again with --foreground (or start '$BIN_DIR/levers9-agent run --state-dir $STATE_DIR' under your supervisor)"
fi
`))
