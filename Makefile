# ONC — see README.md. `make lab` shows ONC working; `make test` runs the tests.
SHELL := /bin/bash
GO ?= go
BIN := bin
PROTOC_GEN_GO_VERSION := v1.36.12
PROTOC_GEN_GO_GRPC_VERSION := v1.5.1
GOBIN_TOOLS := $(CURDIR)/.tools
export PATH := $(GOBIN_TOOLS):$(PATH)

BINARIES := onc onc-agent onc-controller onctl onc-lab onc-bench

.PHONY: all build test unit privileged e2e fuzz lab lab-down bench flannel-bins bench-scale bench-services-scale bench-policy generate verify-generated lint prereqs clean kube-bins image e2e-kind e2e-kind-down

# Kubernetes release built from source (e2e/kind/kube/go.mod pins it) for
# the Kubernetes datastore tests and the kind bed; the cache outlives clones.
KUBE_VERSION := $(shell awk '$$1=="require" && $$2=="k8s.io/kubernetes" {print $$3}' e2e/kind/kube/go.mod)
KUBE_BIN ?= /var/cache/onc/kube/$(KUBE_VERSION)
export ONC_KUBE_BIN := $(KUBE_BIN)
export ONC_FLANNEL_BIN := $(GOBIN_TOOLS)/flannel
# The OpenTelemetry Collector the flow export's lab test sends to, built
# from e2e/otelcol (its go.mod pins the release) into a cache keyed by the
# release and the module's files.
OTELCOL_VERSION := $(shell awk '$$1=="go.opentelemetry.io/collector/otelcol" {print $$2}' e2e/otelcol/go.mod)
OTELCOL_KEY := $(shell cat e2e/otelcol/go.mod e2e/otelcol/go.sum e2e/otelcol/main.go | sha256sum | cut -c1-12)
OTELCOL_BIN ?= /var/cache/onc/otelcol/$(OTELCOL_VERSION)-$(OTELCOL_KEY)
export ONC_OTELCOL_BIN := $(OTELCOL_BIN)/otelcol
# The kind bed's ClusterNetworkPolicy conformance runner (CNP=1), built
# from e2e/kind/npa (its go.mod pins the network-policy-api release) into a
# cache keyed the same way.
NPA_VERSION := $(shell awk '$$1=="sigs.k8s.io/network-policy-api" {print $$2}' e2e/kind/npa/go.mod)
NPA_KEY := $(shell cat e2e/kind/npa/go.mod e2e/kind/npa/go.sum e2e/kind/npa/*.go | sha256sum | cut -c1-12)
NPA_BIN ?= /var/cache/onc/npa/$(NPA_VERSION)-$(NPA_KEY)

all: build

build:
	@mkdir -p $(BIN)
	CGO_ENABLED=0 $(GO) build -o $(BIN)/ $(addprefix ./cmd/,$(BINARIES))

# Debian packages the lab and the tests use (root; run once per machine),
# and the OpenTelemetry Collector of the flow export's test (first build
# several minutes).
prereqs:
	./hack/prereqs.sh
	./hack/otelcol-build.sh $(OTELCOL_BIN)

# Brings up the local lab (3 nodes, 2 pods each, embedded etcd), prints its
# connectivity matrix and what the fast path did with the matrix's traffic
# (hits and misses per node). It stays up: explore with bin/onctl, remove
# with `make lab-down`.
lab: prereqs build
	$(BIN)/onc-lab up --bin $(CURDIR)/$(BIN) $(LAB_ARGS)

# Removes the lab. It takes the LAB_ARGS `make lab` took; only --prefix and
# --state-root matter to it.
lab-down: build
	$(BIN)/onc-lab down $(LAB_ARGS)

# netperf and redis on a fresh 2-node lab in Kubernetes mode, the nodes on
# a direct veth pair: bare underlay vs Flannel vs slow path vs fast path,
# then TCP_RR and TCP_CRR to a ClusterIP through socket
# LB vs kube-proxy (iptables mode) vs the pod IP, then two pods of one node
# through the intra-node bypass vs the stack at 1 B-16 KiB; then, on a lab
# of its own on the bridge underlay, TCP_RR and TCP_CRR from a host outside
# the cluster to a NodePort through ONC's kube-proxy replacement vs
# kube-proxy in iptables and nftables mode; and (on the first lab) TCP_RR
# and TCP_CRR with flow records on vs off, without and with a policy,
# and the agent's memory with its record store full; writes
# bench-results/latest.{json,md,svg}. BENCH_ARGS e.g. "--reps 7",
# "--pods=false", "--services=false", "--intranode=false", "--nodeports=false",
# "--flows=false".
bench: prereqs build kube-bins flannel-bins
	./hack/netperf.sh $(GOBIN_TOOLS)/netperf
	$(BIN)/onc-bench --kube-bin $(KUBE_BIN) --netperf $(GOBIN_TOOLS)/netperf/usr/bin --flannel $(GOBIN_TOOLS)/flannel $(BENCH_ARGS)

# flanneld and its CNI plugins for the bench's flannel configuration (and
# its test, TestBenchBed).
flannel-bins:
	./hack/flannel-build.sh $(GOBIN_TOOLS)/flannel

# The scale bed (docs/performance.md, "Scale"): N simulated nodes in a real
# datastore (embedded etcd, kube-apiserver), one real agent programming
# them all; writes bench-results/scale.{json,md,svg}. SCALE_ARGS e.g.
# "--nodes 100 --datastores etcd" (default: 100, 1000 and 5000 on both).
bench-scale: prereqs build kube-bins
	$(BIN)/onc-bench scale --kube-bin $(KUBE_BIN) $(SCALE_ARGS)

# Services at scale (docs/performance.md, "Services at scale"): 10, 1,000
# and 10,000 Services of 10 endpoints on a fresh 2-node lab in Kubernetes
# mode; per size, ONC's kube-proxy replacement vs real kube-proxy in
# iptables and nftables mode: time to program, memory, TCP_CRR to one
# Service; writes bench-results/services-scale.{json,md,svg}.
# SERVICES_SCALE_ARGS e.g. "--services 10,1000 --reps 3".
bench-services-scale: prereqs build kube-bins
	./hack/netperf.sh $(GOBIN_TOOLS)/netperf
	$(BIN)/onc-bench services-scale --kube-bin $(KUBE_BIN) --netperf $(GOBIN_TOOLS)/netperf/usr/bin $(SERVICES_SCALE_ARGS)

# NetworkPolicy (docs/policy.md): rule programming time and memory for
# 100/1000/5000 pods × 10/100/1000 policies (each in a throwaway network
# namespace), and TCP_CRR through the slow path with no policy vs 1,000 on
# a fresh 2-node lab in Kubernetes mode; writes bench-results/policy.{json,md}.
# POLICY_ARGS e.g. "--crr=false --pods 1000 --policies 1000".
bench-policy: prereqs build kube-bins
	./hack/netperf.sh $(GOBIN_TOOLS)/netperf
	$(BIN)/onc-bench policy --kube-bin $(KUBE_BIN) --netperf $(GOBIN_TOOLS)/netperf/usr/bin $(POLICY_ARGS)

# The test tiers (CONTRIBUTING.md, "Test tiers"). A test file that needs
# root, the kernel or binaries built here (kube-apiserver, ONC's commands)
# starts with //go:build privileged; the lab tests in e2e/ with
# //go:build e2e. internal/testutil's root helpers fail a test built
# without either, so such a test cannot land in the unit tier.
TEST_TAGS := privileged,e2e

# Every package's logic: no root, no outside program beyond make prereqs'
# (etcd, promtool), under a minute. Run it before every commit. Its tests
# mostly wait (timeouts, timers), so it runs more of them at a time than
# there are cores: 4 packages, 8 parallel subtests.
unit:
	$(GO) test -count=1 -p 4 -parallel 8 -timeout 5m ./...

# The unit tests again, with those that need the real kernel (network
# namespaces, veth, VXLAN, eBPF, iptables and nft, cgroups) or
# kube-apiserver. They need root: without it they skip, saying why, and
# with ONC_PRIVILEGED=1 (as .ci/run sets) they fail instead.
privileged: prereqs kube-bins
	$(GO) test -count=1 -p 1 -timeout 25m -tags privileged ./...

# The lab tests (e2e/): labs of real agents in network namespaces (root).
e2e: prereqs kube-bins flannel-bins
	$(GO) test -count=1 -p 1 -timeout 25m -tags e2e ./e2e/

# Everything, as CI runs it (.ci/run): prerequisites, generated code, lint,
# the three tiers in turn, then every fuzz target for a short budget.
test: prereqs verify-generated lint unit privileged e2e fuzz

# Every fuzz target (go test -fuzz) for FUZZ_EXECS executions (10000),
# about 2-3 min; fails on a crash, which is kept in the package's
# testdata/fuzz/ (README, "Fuzzing").
FUZZ_EXECS ?= 10000
fuzz:
	GO=$(GO) FUZZ_EXECS=$(FUZZ_EXECS) ./hack/fuzz.sh

# kube-apiserver for the Kubernetes datastore tests and kube-proxy for
# make bench (first build ≈6 min).
kube-bins:
	./hack/kube-build.sh $(KUBE_BIN) kube-apiserver kube-proxy

# ONC's image (Dockerfile). IMAGE_BASE must have iptables or reach Debian.
IMAGE ?= onc:dev
IMAGE_BASE ?= debian:bookworm-slim
DOCKER ?= docker
image: build
	$(DOCKER) build --build-arg BASE=$(IMAGE_BASE) -t $(IMAGE) .

# The kind bed (docs/kind.md): a kind cluster with ONC as its only
# CNI, then the [sig-network] Conformance tests. Offline on this machine:
# every image is built locally and cached (first run ≈40 min).
e2e-kind: prereqs build
	./hack/kube-build.sh $(KUBE_BIN) kubectl kubeadm kubelet kube-apiserver kube-controller-manager kube-scheduler kube-proxy e2e.test agnhost regression-issue-74839 ginkgo
	$(if $(filter 1,$(CNP)),./hack/npa-build.sh $(NPA_BIN))
	KUBE_BIN=$(KUBE_BIN) KUBE_VERSION=$(KUBE_VERSION) NPA_TEST=$(NPA_BIN)/npa-conformance.test ./e2e/kind/run.sh $(E2E_KIND_ARGS)

e2e-kind-down:
	KUBE_BIN=$(KUBE_BIN) KUBE_VERSION=$(KUBE_VERSION) ./e2e/kind/run.sh down

STATICCHECK_VERSION := v0.8.2

$(GOBIN_TOOLS)/staticcheck:
	GOBIN=$(GOBIN_TOOLS) $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)

# gofmt, then vet and staticcheck on the build with every tier's tests, and
# staticcheck on the unit tier's own build too: it finds a helper left in
# an untagged file that only tagged tests use.
lint: $(GOBIN_TOOLS)/staticcheck
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed: $$out"; exit 1; fi
	$(GO) vet -tags $(TEST_TAGS) ./...
	$(GOBIN_TOOLS)/staticcheck -tags $(TEST_TAGS) ./...
	$(GOBIN_TOOLS)/staticcheck ./...

$(GOBIN_TOOLS)/protoc-gen-go:
	GOBIN=$(GOBIN_TOOLS) $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)

$(GOBIN_TOOLS)/protoc-gen-go-grpc:
	GOBIN=$(GOBIN_TOOLS) $(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION)

# Regenerates the gRPC code (protoc) and the eBPF objects and their Go
# bindings (clang via bpf2go, see datapath/bpf/gen.go).
generate: $(GOBIN_TOOLS)/protoc-gen-go $(GOBIN_TOOLS)/protoc-gen-go-grpc
	protoc -I api/v1 --go_out=api/v1 --go_opt=paths=source_relative \
		--go-grpc_out=api/v1 --go-grpc_opt=paths=source_relative api/v1/onc.proto
	$(GO) generate ./datapath/bpf/

# Fails when the committed generated code is not what `make generate` makes.
GENERATED := api/ datapath/bpf/
verify-generated: generate
	@git diff --exit-code -- $(GENERATED) || { echo "generated code is stale: run make generate and commit"; exit 1; }
	@test -z "$$(git status --porcelain -- $(GENERATED))" || { git status --porcelain -- $(GENERATED); echo "generated code is not committed"; exit 1; }

clean:
	rm -rf $(BIN) $(GOBIN_TOOLS)
