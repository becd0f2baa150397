# The few commands everyone runs. `make help` lists them.
CARGO ?= cargo
PLUGIN_TARGET := wasm32-wasip2
PLUGIN_OUT := target/$(PLUGIN_TARGET)/plugin
PLUGINS_DIR := target/plugins
# crate name -> provider type (the file name the host looks for)
PLUGIN_CRATES := test-provider:test test-provider-next:test-next hostile-provider:hostile hostile-libvirt-provider:hostile-libvirt kvm-provider:kvm kubernetes-provider:kubernetes gcp-provider:gcp upstream-provider:upstream aws-provider:aws

.PHONY: help fixtures toolchain plugins build run test lint fmt bench dev dev-cluster image

help:
	@echo "make dev          the real thing on this machine: a kvm proxy VM boots, is leased and serves a request"
	@echo "                  (installs what it needs; DEV_ONCE=1 does it once and exits, as CI does)"
	@echo "make plugins      build every provider component into $(PLUGINS_DIR)/<type>.wasm"
	@echo "make build        build the operator and the plugins"
	@echo "make run          run the operator against \$$KUBECONFIG with deploy/samples/providers-config.yaml"
	@echo "make test         build the plugins, lint, then run every test (what .ci/run runs)"
	@echo "make lint         cargo fmt --check and clippy -D warnings"
	@echo "make bench        run the benchmarks"
	@echo "make soak         the 10-minute soak (SOAK_SECONDS, SOAK_PROXIES)"
	@echo "make dev-cluster  start a local kube-apiserver + etcd for trying the operator (ARGS=--node: a real node too)"
	@echo "make e2e-cluster  the operator from its image in a real single-node cluster, end to end"
	@echo "make image        the operator's image (Dockerfile) as an OCI archive, built offline with buildah"
	@echo "                  (IMAGE_VARIANT=kvm: the variant with libvirt; CARGO_PROFILE=image-ci for a"
	@echo "                  cheaper build; docs/image.md)"
	@echo "make test-image   the image the tests install: the same Dockerfile, the test build's binary"
	@echo "make release VERSION=x.y.z  dist/: the image (full build) as an OCI archive, install.yaml pinned by its"
	@echo "                  digest, the Helm chart packaged, an SBOM, SHA256SUMS (IMAGE_REPOSITORY=…; docs/image.md)"

# Debian packages, kube-apiserver/etcd/kubectl and the guest image (idempotent; needs root).
fixtures:
	.ci/install-fixtures.sh

toolchain:
	@rustup target list --installed | grep -qx $(PLUGIN_TARGET) || rustup target add $(PLUGIN_TARGET)

plugins: toolchain
	$(CARGO) build --profile plugin --target $(PLUGIN_TARGET) $(foreach p,$(PLUGIN_CRATES),-p $(word 1,$(subst :, ,$(p))))
	@mkdir -p $(PLUGINS_DIR)
	@$(foreach p,$(PLUGIN_CRATES),cp $(PLUGIN_OUT)/$(subst -,_,$(word 1,$(subst :, ,$(p)))).wasm $(PLUGINS_DIR)/$(word 2,$(subst :, ,$(p))).wasm;)
	@ls -l $(PLUGINS_DIR)

build: plugins
	$(CARGO) build --workspace

# Runs the operator against the cluster in $KUBECONFIG (e.g. the one `make dev-cluster` prints).
# The sample's synthetic instances are not real proxies, so health probing is off; the discovery
# API listens on 127.0.0.1:8090 with token $(DISCOVERY_TOKEN), plain HTTP on loopback
# (--discovery-plain-http), and /metrics and /status are open (--metrics-insecure): a local run.
DISCOVERY_TOKEN ?= dev-token
run: plugins
	DISCOVERY_TOKEN=$(DISCOVERY_TOKEN) $(CARGO) run -p proxy-operator -- run \
		--providers-config deploy/samples/providers-config.yaml --plugins-dir $(PLUGINS_DIR) \
		--metrics-addr 127.0.0.1:9090 --discovery-addr 127.0.0.1:8090 --health-interval 0s \
		--discovery-plain-http --metrics-insecure

# Every test, with the 60-second soak and the one-command run of `make dev` once (DEV_ONCE=1), as a
# newcomer would, among the suites.
# Each phase is timed and the table printed at the end, also when one failed (.ci/phase). The
# test binaries are built once and run by .ci/run-suites (SUITE_JOBS=N at most at once, default
# 2, the suites that boot VMs or a node cluster never beside one another, docs/development.md);
# the operator's image the cluster test (host/tests/cluster_e2e.rs) installs takes the test
# build's binary (docs/image.md).
test:
	@.ci/phase --table $(MAKE) --no-print-directory test-phases

.PHONY: test-phases
test-phases:
	.ci/phase fixtures $(MAKE) --no-print-directory fixtures
	.ci/phase plugins $(MAKE) --no-print-directory plugins
	.ci/phase examples $(MAKE) --no-print-directory examples
	.ci/phase "cargo fmt --check" $(CARGO) fmt --all --check
	.ci/phase clippy $(CARGO) clippy --workspace --all-targets -- -D warnings
	@# Every test target, the examples, the binaries and the soak bench, built once.
	.ci/phase "test build" .ci/run-suites --build-only
	.ci/phase "make dev's dep-info beside the binary (the README's order)" $(MAKE) --no-print-directory readme-order
	.ci/phase "operator image (test build's binary)" $(MAKE) --no-print-directory test-image-of-build
	.ci/phase "operator image (full Dockerfile build, when its recipe changed)" \
		$(MAKE) --no-print-directory test-dockerfile
	@# The suites side by side, among them the 60-second soak (host/benches/soak.rs, it checks its
	@# invariants and fails if one broke; `make soak` runs the 10-minute one in release) and
	@# `make dev` once (DEV_ONCE=1) as a newcomer would, with the VM suites.
	.ci/phase "tests (side by side, the soak and make dev among them)" .ci/run-suites

# The operator's main job, for real: control plane, a local hypervisor, the operator with the
# built plugins, a kvm Proxy that boots, becomes Ready and is leased (tests/harness/src/bin/dev.rs).
dev: fixtures plugins
	$(MAKE) --no-print-directory dev-run

.PHONY: dev-run
dev-run:
	$(CARGO) build --bin proxy-operator --bin dev
	target/debug/dev

lint:
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

fmt:
	$(CARGO) fmt --all

bench: plugins
	$(CARGO) bench -p proxy-operator --bench plugin_call
	$(CARGO) bench -p proxy-operator --bench operator_scale
	$(CARGO) bench -p proxy-operator --bench discovery
	$(CARGO) bench -p proxy-operator --bench hot_reload

# Ten minutes of churn, lease traffic, plugin swaps and SIGKILLs; invariants checked at the end.
.PHONY: soak
soak: plugins
	SOAK_SECONDS=600 $(CARGO) bench -p proxy-operator --bench soak

dev-cluster:
	$(CARGO) run -p proxy-operator-harness --bin dev-cluster -- $(ARGS)

# The operator's image from the Dockerfile, with buildah and locally made base images (no
# registry), as an OCI archive in the fixtures cache (path printed last), then checked without a
# cluster: the default (distroless, no libvirt), or with IMAGE_VARIANT=kvm the kvm variant
# (libvirt). Needs root; docs/image.md.
IMAGE_VARIANT ?= default
image:
	@archive="$$(IMAGE_VARIANT=$(IMAGE_VARIANT) tests/fixtures/operator-image/build.sh)" && \
		tests/fixtures/operator-image/check.sh --variant $(IMAGE_VARIANT) "$$archive" && echo "$$archive"

# The image the tests install: the Dockerfile's `prebuilt-kvm` target, the same runtime stage as
# the user's kvm variant with the binary the test build made (target/debug/proxy-operator, with
# the default `libvirt` feature; `cargo test` builds it for the integration tests) and the
# providers of `make plugins`; checked as `make image` is (docs/image.md).
.PHONY: test-image test-image-of-build test-dockerfile e2e-cluster
test-image: plugins
	.ci/run-suites --build-only
	@$(MAKE) --no-print-directory test-image-of-build

# The prebuilt image of the binary already built (what `make test` runs after its test build;
# no cargo here: another cargo command could rebuild the binary with other features). The binary
# is packaged from a hard link under target/test-image/, where no dep-info lies beside it, so
# build.sh reads rustc's dep-info of the operator's crate in the build directory: the files the
# test build compiled it from. Never the `proxy-operator.d` beside target/debug/proxy-operator:
# only a `cargo build` (make dev's) writes that one, a later `cargo test` build replaces the
# binary but not it, and it lists host/build.rs's watch files (.git/HEAD), which the image's
# context leaves out (issue 53: `make dev` then `make test` failed here).
test-image-of-build:
	@mkdir -p target/test-image && ln -f target/debug/proxy-operator target/test-image/proxy-operator
	@archive="$$(OPERATOR_BINARY=target/test-image/proxy-operator \
		CARGO_BUILD_BUILD_DIR="$${CARGO_BUILD_BUILD_DIR:-target}" \
		tests/fixtures/operator-image/build.sh)" && \
		tests/fixtures/operator-image/check.sh "$$archive"

# The README's order, `make dev` then `make test`, every time `make test` runs: `make dev`'s
# `cargo build` leaves cargo's dep-info beside the binary (naming host/build.rs's watch files);
# written as that build writes it when no `make dev` ran before, so the image phase after it
# meets what a user's second command meets.
.PHONY: readme-order
readme-order:
	@d=target/debug/proxy-operator.d; [ -f "$$d" ] || { mkdir -p target/debug && \
		printf '%s: %s %s %s\n' "$(CURDIR)/target/debug/proxy-operator" "$(CURDIR)/.git/HEAD" \
		"$(CURDIR)/.git/refs/heads/main" "$(CURDIR)/host/src/main.rs" >"$$d"; }; \
		echo "$$d: $$(cat "$$d" | wc -w) paths, as make dev's cargo build leaves it"

# The full Dockerfile build of both variants (CARGO_PROFILE=image-ci), checked, whenever what it depends on
# besides the sources changed (Dockerfile, .dockerignore, Cargo files, toolchain, scripts) and
# it has not passed for that recipe (docs/image.md); FULL_IMAGE_BUILD=1 forces it.
test-dockerfile:
	tests/fixtures/operator-image/full-build-check.sh

# The operator installed from its image with `kubectl apply -k` in a real single-node cluster
# (kubelet, containerd, kube-proxy in a network namespace with no uplink), a kubernetes-provider
# Proxy serving real traffic, a rollout restart and evictions (host/tests/cluster_e2e.rs).
e2e-cluster: fixtures plugins
	$(CARGO) test -p proxy-operator --test cluster_e2e --no-run
	@$(MAKE) --no-print-directory test-image-of-build
	$(CARGO) test -p proxy-operator --test cluster_e2e -- --nocapture

# Example providers in other languages (target/plugins/python-example.wasm, js-example.wasm); the
# tests load them.
.PHONY: examples
examples:
	plugins/examples/python/build.sh
	plugins/examples/js/build.sh

# The release's artifacts in dist/ with their SHA-256 sums (.ci/release.sh, docs/image.md
# "Release"): the image from the Dockerfile's full build as an OCI archive, install.yaml (the
# CRDs and the operator, the image pinned by that archive's digest), the Helm chart packaged, a
# CycloneDX SBOM of the binary. IMAGE_REPOSITORY names where the image will be pushed.
.PHONY: release
release:
	@test -n "$(VERSION)" || { echo "usage: make release VERSION=x.y.z (the workspace's version, Cargo.toml)" >&2; exit 1; }
	.ci/release.sh "$(VERSION)"
