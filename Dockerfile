# syntax=docker/dockerfile:1
# The proxy-operator image: the operator binary and the real provider plugins.
#
#   docker build -t proxy-operator:dev .                       (or: podman build / buildah bud)
#   docker build --target kvm -t proxy-operator:dev-kvm .      the variant with libvirt
#
# Two variants of one image (docs/image.md):
#   default  the binary built without libvirt (`--no-default-features`) on a distroless base
#            (gcr.io/distroless/cc-debian12:nonroot: glibc, libgcc, CA certificates; no shell, no
#            package manager). Runs every provider but the kvm provider's hypervisors: it refuses
#            a provider instance granted `libvirt`, naming this variant.
#   kvm      (`--target kvm`, tagged `<tag>-kvm`) the binary with the `libvirt` feature on
#            bookworm-slim with libvirt's client library and CA certificates.
# Both: the binary in /usr/local/bin, the providers as /plugins/<type>.wasm, user 65532, nothing
# writable but /tmp (the Deployment runs it with a read-only root file system and an emptyDir
# on /tmp).
#
# Stages: `builder` compiles the providers (wasm32-wasip2, profile `plugin`, as `make plugins`)
# and the binary without libvirt; `builder-kvm` adds the binary with it. `runtime` and
# `runtime-kvm` are the variants without the operator's files; `kvm` and the last, unnamed stage
# (what a plain build makes) add the builders' binary and providers. `prebuilt` and
# `prebuilt-kvm` are the runtimes + a binary and providers compiled outside, from a build context
# that holds prebuilt/proxy-operator and prebuilt/plugins/*.wasm: CI's test image
# (tests/fixtures/operator-image/build.sh with OPERATOR_BINARY picks the one the binary links
# for), which reuses the test build's binary instead of compiling everything a second time.
#
# Build arguments:
#   CARGO_PROFILE  cargo profile of the operator binary: release (default), or a cheaper one for
#                  CI (e.g. `image-ci`, see Cargo.toml and docs/image.md)
#   PLUGINS        crate:type pairs of the providers put under /plugins
#   VERSION, REVISION  OCI labels; REVISION is also the commit `--version` prints
#   RUST_IMAGE, RUNTIME_IMAGE, KVM_RUNTIME_IMAGE  the base images

ARG RUST_IMAGE=docker.io/library/rust:1.95-bookworm
ARG RUNTIME_IMAGE=gcr.io/distroless/cc-debian12:nonroot
ARG KVM_RUNTIME_IMAGE=docker.io/library/debian:bookworm-slim

FROM ${RUST_IMAGE} AS builder
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
# The default image's binary: without the `libvirt` feature, so it links no libvirt.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    set -eu; \
    PROXY_OPERATOR_REVISION="$REVISION" \
        cargo build --locked --profile "$CARGO_PROFILE" -p proxy-operator --bin proxy-operator \
        --no-default-features; \
    dir="$CARGO_PROFILE"; [ "$dir" != dev ] || dir=debug; \
    install -m 0755 "target/$dir/proxy-operator" /out/proxy-operator; \
    ls -l /out/proxy-operator

# The kvm variant's binary: with the `libvirt` feature (the crate's default), linked against
# libvirt's client library, found through pkg-config (installing them is a no-op when the base
# has them). Only the operator's crate and virt compile again: the target directory is shared.
FROM builder AS builder-kvm
RUN if ! dpkg -s pkg-config libvirt-dev >/dev/null 2>&1; then \
        apt-get update \
        && apt-get install -y --no-install-recommends pkg-config libvirt-dev \
        && rm -rf /var/lib/apt/lists/*; \
    fi
ARG CARGO_PROFILE=release
ARG REVISION=unknown
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    set -eu; \
    PROXY_OPERATOR_REVISION="$REVISION" \
        cargo build --locked --profile "$CARGO_PROFILE" -p proxy-operator --bin proxy-operator; \
    dir="$CARGO_PROFILE"; [ "$dir" != dev ] || dir=debug; \
    install -m 0755 "target/$dir/proxy-operator" /out/proxy-operator; \
    ls -l /out/proxy-operator

# The kvm variant's runtime: bookworm-slim + libvirt0 (the kvm provider's libvirt client, over
# the operator's SSH tunnel) + ca-certificates (the gcp and aws providers' HTTPS, the API
# server). Then nothing in the image stays writable by the operator's user but /tmp (Debian's
# /var/tmp and /run/lock are world-writable), and user 65532 gets a name.
FROM ${KVM_RUNTIME_IMAGE} AS runtime-kvm
ARG KVM_RUNTIME_IMAGE
ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="proxy-operator" \
      org.opencontainers.image.description="A Kubernetes operator that gives web crawlers a pool of healthy egress proxies, with WebAssembly provider plugins (kvm, kubernetes, gcp, upstream, aws) under /plugins. The kvm variant: with libvirt's client for the kvm provider." \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.base.name="${KVM_RUNTIME_IMAGE}"
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

# CI's test image of a binary with libvirt (the test build's): the kvm runtime, the binary and
# providers the test build made (root-owned, as COPY makes them whatever USER says).
FROM runtime-kvm AS prebuilt-kvm
COPY prebuilt/proxy-operator /usr/local/bin/proxy-operator
COPY prebuilt/plugins/ /plugins/

# The kvm variant: its runtime and what builder-kvm compiled.
FROM runtime-kvm AS kvm
COPY --from=builder-kvm /out/proxy-operator /usr/local/bin/proxy-operator
COPY --from=builder-kvm /out/plugins/ /plugins/

# The default runtime: distroless (glibc, libgcc_s, CA certificates, tzdata, /etc/passwd with
# nonroot = 65532, /tmp 1777; no shell, so no RUN here). Its user is already 65532.
FROM ${RUNTIME_IMAGE} AS runtime
ARG RUNTIME_IMAGE
ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="proxy-operator" \
      org.opencontainers.image.description="A Kubernetes operator that gives web crawlers a pool of healthy egress proxies, with WebAssembly provider plugins (kvm, kubernetes, gcp, upstream, aws) under /plugins. Without libvirt: the kvm provider needs the -kvm variant." \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.base.name="${RUNTIME_IMAGE}"
USER 65532:65532
WORKDIR /tmp
ENTRYPOINT ["/usr/local/bin/proxy-operator"]
CMD ["run"]

# CI's test image of a binary without libvirt.
FROM runtime AS prebuilt
COPY prebuilt/proxy-operator /usr/local/bin/proxy-operator
COPY prebuilt/plugins/ /plugins/

# The image: the runtime and what the builder compiled.
FROM runtime
COPY --from=builder /out/proxy-operator /usr/local/bin/proxy-operator
COPY --from=builder /out/plugins/ /plugins/
