#!/usr/bin/env bash
# Regenerates the Go code for api/levers9/v1 with Debian's protoc and the
# plugin versions pinned in go.mod. Usage: api/generate.sh [OUT_DIR]
# (default: the repository itself). The staleness test runs it into a
# temporary directory and compares.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${1:-$ROOT}"
BIN="$(mktemp -d)"
trap 'rm -rf "$BIN"' EXIT
cd "$ROOT"
go build -o "$BIN/" \
  google.golang.org/protobuf/cmd/protoc-gen-go \
  google.golang.org/grpc/cmd/protoc-gen-go-grpc \
  github.com/grpc-ecosystem/grpc-gateway/v2/protoc-gen-grpc-gateway
mkdir -p "$OUT"
protoc -I "$ROOT" -I /usr/include \
  --plugin=protoc-gen-go="$BIN/protoc-gen-go" \
  --plugin=protoc-gen-go-grpc="$BIN/protoc-gen-go-grpc" \
  --plugin=protoc-gen-grpc-gateway="$BIN/protoc-gen-grpc-gateway" \
  --go_out="$OUT" --go_opt=module=github.com/levers9/levers9 \
  --go-grpc_out="$OUT" --go-grpc_opt=module=github.com/levers9/levers9 \
  --grpc-gateway_out="$OUT" --grpc-gateway_opt=module=github.com/levers9/levers9 \
  --grpc-gateway_opt=grpc_api_configuration=api/levers9/v1/gateway.yaml \
  --grpc-gateway_opt=generate_unbound_methods=false \
  api/levers9/v1/*.proto
protoc -I "$ROOT" -I /usr/include \
  --plugin=protoc-gen-go="$BIN/protoc-gen-go" \
  --plugin=protoc-gen-go-grpc="$BIN/protoc-gen-go-grpc" \
  --go_out="$OUT" --go_opt=module=github.com/levers9/levers9 \
  --go-grpc_out="$OUT" --go-grpc_opt=module=github.com/levers9/levers9 \
  api/levers9/agent/v1/*.proto
