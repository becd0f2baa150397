# syntax=docker/dockerfile:1
# The proxy-operator image: the operator binary and the real provider plugins.
#
#   docker build -t proxy-operator:dev .        (or: podman build / buildah bud)
#
# Builder: Rust 1.95 on bookworm builds `proxy-operator` (crate host/) and the providers
# (wasm32-wasip2, profile `plugin`, as `make plugins`). Runtime: bookworm-slim with libvirt's
# client library and CA certificates, the binary in /usr/local/bin, the providers as
# /plugins/<type>.wasm, user 65532, nothing writable but /tmp (the Deployment runs it with a
# read-only root file system and an emptyDir on /tmp). See docs/image.md.
#
# Stages: `builder` compiles; `runtime` is the image without the operator's files; the last,
# unnamed stage (what a plain build makes) is `runtime` + the builder's binary and providers.
# `prebuilt` is `runtime` + a binary and providers compiled outside, from a build context that
# holds prebuilt/proxy-operator and prebuilt/plugins/*.wasm: CI's test image
# (`--target prebuilt`, tests/fixtures/operator-image/build.sh with OPERATOR_BINARY), which reuses
# the test build's binary instead of compiling everything a second time. See docs/image.md.
#
# Build arguments:
#   CARGO_PROFILE  cargo profile of the operator binary: release (default), or a cheaper one for
#                  CI (e.g. `image-ci`, see Cargo.toml and docs/image.md)
#   PLUGINS        crate:type pairs of the providers put under /plugins
#   VERSION, REVISION  OCI labels; REVISION is also the commit `--version` prints
#   RUST_IMAGE, RUNTIME_IMAGE  the two base images

ARG RUST_IMAGE=docker.io/library/rust:1.95-bookworm
ARG RUNTIME_IMAGE=docker.io/library/debian:bookworm-slim

FROM ${RUST_IMAGE} AS builder
# virt-sys links libvirt's client library through pkg-config (a no-op when the base has them).
RUN if ! dpkg -s pkg-config libvirt-dev >/dev/null 2>&1; then \
        apt-get update \
        && apt-get install -y --no-install-recommends pkg-config libvirt-dev \
        && rm -rf /var/lib/apt/lists/*; \
    fi
RUN rustup target list --installed | grep -qx wasm32-wasip2 || rustup target add wasm32-wasip2
WORKDIR /src
# The cargo registry and the target directory are cache mounts: a rebuild after a source change
# compiles only the workspace's own crates. (A separate dependencies-only layer would not pay
# on top of that: it needs stub sources for all eleven workspace members.)
COPY . .
ARG PLUGINS="kvm-provider:kvm kubernetes-provider:kubernetes gcp-provider:gcp upstream-provider:upstream aws-provider:aws"
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    set -eu; \
    pkgs=""; for p in $PLUGINS; do pkgs="$pkgs -p ${p%%:*}"; done; \
    cargo build --locked --profile plugin --target wasm32-wasip2 $pkgs; \
    mkdir -p /out/plugins; \
    for p in $PLUGINS; do \
        crate="${p%%:*}"; \
        install -m 0644 "target/wasm32-wasip2/plugin/$(echo "$crate" | tr - _).wasm" "/out/plugins/${p#*:}.wasm"; \
    done; \
    ls -l /out/plugins
ARG CARGO_PROFILE=release
# The commit `proxy-operator --version` prints (host/build.rs): the context has no .git.
ARG REVISION=unknown
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    set -eu; \
    PROXY_OPERATOR_REVISION="$REVISION" \
        cargo build --locked --profile "$CARGO_PROFILE" -p proxy-operator --bin proxy-operator; \
    dir="$CARGO_PROFILE"; [ "$dir" != dev ] || dir=debug; \
    install -m 0755 "target/$dir/proxy-operator" /out/proxy-operator; \
    ls -l /out/proxy-operator

FROM ${RUNTIME_IMAGE} AS runtime
ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="proxy-operator" \
      org.opencontainers.image.description="A Kubernetes operator that gives web crawlers a pool of healthy egress proxies, with WebAssembly provider plugins (kvm, kubernetes, gcp, upstream, aws) under /plugins." \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.base.name="docker.io/library/debian:bookworm-slim"
# libvirt0: the kvm provider's libvirt client (over the operator's SSH tunnel); ca-certificates:
# the gcp provider's HTTPS. Then nothing in the image stays writable by the operator's user
# but /tmp (Debian's /var/tmp and /run/lock are world-writable), and user 65532 gets a name.
RUN set -eu; \
    apt-get update; \
    apt-get install -y --no-install-recommends libvirt0 ca-certificates; \
    rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/cache/apt/archives/*.deb \
        /var/log/apt/* /var/log/*.log; \
    find / -xdev -perm -0002 ! -type l ! -path /tmp -exec chmod o-w {} +; \
    for d in /var/tmp /run/lock; do if [ -d "$d" ] && [ ! -L "$d" ]; then chmod 0755 "$d"; fi; done; \
    chmod 1777 /tmp; \
    echo 'nonroot:x:65532:65532:nonroot:/nonexistent:/usr/sbin/nologin' >>/etc/passwd; \
    echo 'nonroot:x:65532:' >>/etc/group
USER 65532:65532
WORKDIR /tmp
ENTRYPOINT ["/usr/local/bin/proxy-operator"]
CMD ["run"]

# CI's test image: the same runtime, the binary and providers the test build made (root-owned,
# as COPY makes them whatever USER says). Unused by a plain build.
FROM runtime AS prebuilt
COPY prebuilt/proxy-operator /usr/local/bin/proxy-operator
COPY prebuilt/plugins/ /plugins/

# The image: the runtime and what the builder compiled.
FROM runtime
COPY --from=builder /out/proxy-operator /usr/local/bin/proxy-operator
COPY --from=builder /out/plugins/ /plugins/
