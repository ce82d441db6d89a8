# levers9 — see README.md. Two commands matter: `make up` and `make test`.
SHELL := /bin/bash
export GOFLAGS ?= -mod=mod

.PHONY: all deps build release up down test proto lint bench chaos

all: build

deps:
	@bash packaging/dev/deps.sh

build:
	@mkdir -p bin
	go build -o bin/ ./cmd/...

# Release binaries for linux/amd64 and linux/arm64 into dist/ with SHA256SUMS
# and VERSION (VERSION=, ONLY=amd64, ARM64_NVML=0: see the script).
release:
	@bash packaging/release/release.sh

# Brings up Postgres, Redis, a single-node SeaweedFS for volumes
# (LEVERS9_VOLUMES=0 skips it; its weed takes 10-20 minutes to build the
# first time) and the controlplane on free local ports under .levers9-dev/,
# bootstraps the first workspace and saves the CLI context "local".
up: deps build
	@go run ./packaging/dev/stack up

down:
	@go run ./packaging/dev/stack down

# A real Kubernetes control plane (apiserver, etcd, controller manager,
# scheduler, kwok fake nodes, one with nvidia.com/gpu) on free local ports
# under .levers9-kube/; prints the kubeconfig. Binaries are built once from
# the Go module proxy by packaging/kube/build.sh (10-30 minutes cold).
.PHONY: kube-up kube-down kube-status
kube-up:
	@go run ./packaging/kubelocal up

kube-down:
	@go run ./packaging/kubelocal down

kube-status:
	@go run ./packaging/kubelocal status

test: deps
	@bash packaging/dev/test.sh

# The whole-stack fault run (test/chaos) at full length: two controlplane
# replicas, three agents, 1,000 tasks through the SDK while replicas, agents,
# Redis, Postgres and tunnel packets fail at random for
# LEVERS9_CHAOS_DURATION (root; `make test` runs its short form).
LEVERS9_CHAOS_DURATION ?= 30m
chaos:
	cd test/chaos && LEVERS9_CHAOS_DURATION=$(LEVERS9_CHAOS_DURATION) go test -run TestChaos -count=1 -v -timeout 3h .

proto:
	@bash api/generate.sh

lint:
	@test -z "$$(gofmt -l . | tee /dev/stderr)" || (echo "gofmt: the files above need formatting" >&2; exit 1)
	go vet ./...
	go tool staticcheck ./...

# Container images from Debian packages and the release binaries, no
# Docker engine (packaging/images): make images REGISTRY=host/prefix
# [IMAGES=controlplane,worker,runner,dashboard-api,dashboard-web] [TAG=latest]
# [DASHBOARD_API_BASE=https://levers9-api.example.com] (NEXT_PUBLIC_API_BASE,
# fixed in the dashboard-web image). Pushes TAG and a run tag
# sha-COMMIT-TIME; package lists and digests go to dist/images/.
.PHONY: images
IMAGES ?= controlplane,worker,runner,dashboard-api,dashboard-web
DASHBOARD_API_BASE ?=
TAG ?= latest
images: release
	@test -n "$(REGISTRY)" || { echo "make images: set REGISTRY=host[:port]/prefix" >&2; exit 1; }
	go run ./packaging/images --registry "$(REGISTRY)" --tag "$(TAG)" --images "$(IMAGES)" --dist dist --dashboard-api-base "$(DASHBOARD_API_BASE)"

bench:
	@for b in bench/*/; do [ -f "$$b/main.go" ] && { echo "== $$b"; go run "./$$b" -quick || exit 1; }; done; true
