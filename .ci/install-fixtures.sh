#!/usr/bin/env bash
# Installs everything the test fixtures need (see docs/development.md):
#   - Debian packages: squid, sshd, libvirt + QEMU (from bookworm-backports), ...
#   - kube-apiserver, kubectl and etcd built from Go modules into a cache
#     (tests/fixtures/k8s/build.sh).
#   - helm, built from its Go module into the same cache (tests/fixtures/helm/build.sh).
#   - cargo-cyclonedx (the release's SBOM), `cargo install --locked` of a pinned version into
#     the same cache (tests/fixtures/cargo-cyclonedx/install.sh).
#   - the proxy VM guest image, from Debian packages, into the same cache
#     (tests/fixtures/guest-image/build.sh).
#   - the single-node cluster's container images (pause, squid, web), from Debian packages
#     and Kubernetes' pause.c, into the same cache (tests/fixtures/node-images/build.sh).
# Idempotent; a few hundred milliseconds when everything is present.
# Needs root for apt (run as root or through sudo).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

log() { printf '[install-fixtures] %s\n' "$*" >&2; }
now() { echo "${EPOCHREALTIME/,/.}"; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
step_start=0
step_name=
# step NAME WHAT: logs WHAT; step_done logs the time and adds a row NAME to the timing table
# of .ci/run / `make test` (.ci/phase, $PHASES_FILE) when there is one.
step() { step_start=$(now); step_name="$1"; shift; log "$*"; }
record() { [[ -z ${PHASES_FILE:-} ]] || printf 'fixtures: %s\t%s\tok\n' "$1" "$(elapsed "$2")" >>"$PHASES_FILE"; }
step_done() { log "  done in $(elapsed "$step_start") s"; record "$step_name" "$step_start"; }

# qemu + libvirt come from bookworm-backports (libvirt 11, QEMU 10). Plain
# bookworm's qemu-system-x86 7.2 conflicts with a backports qemu-utils and would
# silently remove qemu-img.
backports_pkgs=(
    libvirt-daemon-system libvirt-daemon-system-sysv libvirt-daemon-driver-qemu
    libvirt-clients libvirt-dev qemu-system-x86 qemu-utils
)
# python3-venv: the Python example provider is built with componentize-py in a venv.
# genisoimage, libarchive-tools, xorriso: readers that check the NoCloud seed ISO (plugins/seed-iso).
# busybox-static, syslinux, syslinux-common, mtools, dosfstools: the bootable test disk a kvm
# provider VM really boots under TCG (tests/harness/src/bootdisk.rs).
# debootstrap, e2fsprogs, passt, ovmf, iptables: the proxy VM guest image
# (tests/fixtures/guest-image/build.sh), booted with passt user networking (BIOS or UEFI)
# behind an iptables egress guard (tests/harness/src/guard.rs).
# containerd, runc, containernetworking-plugins, umoci, gcc: the single-node cluster
# (tests/harness/src/node.rs) and its images (tests/fixtures/node-images/build.sh).
# buildah, skopeo, jq: the operator's image from the Dockerfile and its checks (tests/fixtures/operator-image/, `make
# test-image`).
# curl: a client of the gateway's tests (host/tests/discovery_api/gateway.rs) and the cluster e2e.
# chromium: the headless browser of the gateway's browser test (host/tests/discovery_api/browser.rs).
# dante-server, microsocks: real SOCKS5 servers standing in for a vendor's SOCKS5 proxies (dante
# without a login, microsocks with one; tests/harness/src/socks.rs, host/tests/operator/upstream_socks5.rs).
# prometheus: its promtool checks the PrometheusRule's alerts and runs their unit tests
# (host/tests/deploy/alerts.rs); the server it also installs is stopped and disabled below.
plain_pkgs=(prometheus curl chromium squid dante-server microsocks openssh-server openssh-client pkg-config python3-venv genisoimage libarchive-tools xorriso
    busybox-static syslinux syslinux-common mtools dosfstools
    debootstrap e2fsprogs passt ovmf iptables
    containerd runc containernetworking-plugins umoci gcc
    buildah skopeo jq)
# nodejs, npm: the JavaScript example provider is built with componentize-js (npm ci). The
# machine's Node.js 20 and npm come first; Debian's (Node.js 18, which plugins/examples/js/build.sh
# refuses as too old for componentize-js) are installed only where there is no npm at all.
if ! command -v npm >/dev/null 2>&1; then
    plain_pkgs+=(nodejs npm)
fi

# Prints the packages of "$@" that are not installed.
missing() {
    local p status
    for p in "$@"; do
        status="$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)"
        [[ "$status" == installed ]] || echo "$p"
    done
}

as_root() {
    if [[ $EUID -eq 0 ]]; then "$@"; else sudo "$@"; fi
}

# Writes a deb822 sources file for bookworm-backports by copying the stanza of
# the machine's own bookworm source (so no archive host is named here).
ensure_backports_source() {
    local dst=/etc/apt/sources.list.d/proxy-operator-bookworm-backports.sources
    local src=/etc/apt/sources.list.d/debian.sources
    if grep -rqs 'bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/; then
        return 1 # already configured (by us or by the machine)
    fi
    [[ -r $src ]] || { log "cannot find $src to derive a bookworm-backports entry"; exit 1; }
    local stanza
    # The first stanza whose Suites list contains plain "bookworm".
    stanza="$(awk -v RS='' '/(^|\n)Suites:([^\n]* )?bookworm( |\n|$)/ { print; exit }' "$src" |
        sed -e 's/^Suites:.*/Suites: bookworm-backports/' -e '/^#/d')"
    [[ -n $stanza ]] || { log "no bookworm stanza in $src"; exit 1; }
    printf '%s\n' "$stanza" | as_root tee "$dst" >/dev/null
    log "wrote $dst"
    return 0
}

total_start=$(now)

step packages "Debian packages"
mapfile -t need_backports < <(missing "${backports_pkgs[@]}")
mapfile -t need_plain < <(missing "${plain_pkgs[@]}")
if ((${#need_backports[@]} + ${#need_plain[@]} == 0)); then
    log "  all installed"
else
    log "  missing: ${need_backports[*]} ${need_plain[*]}"
    updated=0
    if ((${#need_backports[@]})) && ensure_backports_source; then
        as_root apt-get update -qq
        updated=1
    fi
    if ((${#need_backports[@]})); then
        if ! as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            -t bookworm-backports "${need_backports[@]}"; then
            ((updated)) || { as_root apt-get update -qq && updated=1; }
            as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
                -t bookworm-backports "${need_backports[@]}"
        fi
    fi
    if ((${#need_plain[@]})); then
        if ! as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            "${need_plain[@]}"; then
            ((updated)) || as_root apt-get update -qq
            as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
                "${need_plain[@]}"
        fi
    fi
    mapfile -t still < <(missing "${backports_pkgs[@]}" "${plain_pkgs[@]}")
    ((${#still[@]} == 0)) || { log "still missing after apt-get: ${still[*]}"; exit 1; }
fi
# Debian's prometheus package starts its server (:9090) where systemd runs; the tests need only
# promtool, and a server of its own on the metrics port would be in the way.
if [[ -d /run/systemd/system ]] && systemctl is-enabled --quiet prometheus.service 2>/dev/null; then
    as_root systemctl disable --now prometheus.service
    log "  disabled Debian's prometheus.service (only promtool is used)"
fi
step_done

# The crawler examples (docs/examples/) run in a test with Scrapy and requests: a venv keyed by
# docs/examples/requirements.txt (a copy of it in the venv says what is installed). Python is only
# for the examples; the operator does not use it.
step "Python venv" "Python venv of the crawler examples (docs/examples/requirements.txt)"
pyenv="${PROXY_OPERATOR_PYENV:-$HOME/.cache/proxy-operator/pyenv}"
requirements="$repo/docs/examples/requirements.txt"
if [[ -x "$pyenv/bin/python" ]] && cmp -s "$requirements" "$pyenv/requirements.txt"; then
    log "  present: $pyenv"
else
    python="$(command -v /usr/bin/python3 || command -v python3)"
    # Built in place (a venv's scripts name its own path); the copy of the requirements, written
    # last, marks it complete, so an interrupted install is redone.
    rm -rf "$pyenv"
    "$python" -m venv "$pyenv"
    "$pyenv/bin/pip" install --quiet --disable-pip-version-check -r "$requirements"
    cp "$requirements" "$pyenv/requirements.txt"
    log "  installed into $pyenv"
fi
step_done

# Schemathesis, the OpenAPI fuzzer the discovery API's test runs against the live API
# (host/tests/discovery_api.rs): its own venv keyed by tests/fixtures/schemathesis/requirements.txt,
# as the examples' is. A test tool only: it talks to loopback.
step "schemathesis" "schemathesis venv (tests/fixtures/schemathesis/requirements.txt)"
stenv="${PROXY_OPERATOR_SCHEMATHESIS:-$HOME/.cache/proxy-operator/schemathesis}"
st_requirements="$repo/tests/fixtures/schemathesis/requirements.txt"
if [[ -x "$stenv/bin/schemathesis" ]] && cmp -s "$st_requirements" "$stenv/requirements.txt"; then
    log "  present: $stenv"
else
    python="$(command -v /usr/bin/python3 || command -v python3)"
    rm -rf "$stenv"
    "$python" -m venv "$stenv"
    "$stenv/bin/pip" install --quiet --disable-pip-version-check -r "$st_requirements"
    cp "$st_requirements" "$stenv/requirements.txt"
    log "  installed into $stenv"
fi
step_done

# moto, the AWS emulator the aws provider's tests run against (tests/harness/src/moto.rs): its own
# venv keyed by tests/fixtures/moto/requirements.txt, as schemathesis' is. It serves loopback only.
step "moto" "moto venv (tests/fixtures/moto/requirements.txt)"
motoenv="${PROXY_OPERATOR_MOTO:-$HOME/.cache/proxy-operator/moto}"
moto_requirements="$repo/tests/fixtures/moto/requirements.txt"
if [[ -x "$motoenv/bin/moto_server" ]] && cmp -s "$moto_requirements" "$motoenv/requirements.txt"; then
    log "  present: $motoenv"
else
    python="$(command -v /usr/bin/python3 || command -v python3)"
    rm -rf "$motoenv"
    "$python" -m venv "$motoenv"
    "$motoenv/bin/pip" install --quiet --disable-pip-version-check -r "$moto_requirements"
    cp "$moto_requirements" "$motoenv/requirements.txt"
    log "  installed into $motoenv"
fi
step_done

# Debian's kernel for the test guest: the package is downloaded, not installed (it would touch
# /boot); only its vmlinuz is kept in the fixture cache.
step "guest kernel" "guest kernel (Debian linux-image-amd64, vmlinuz only)"
kernel_dir="${PROXY_OPERATOR_FIXTURES:-$HOME/.cache/proxy-operator/fixtures}/guest-kernel"
if [[ -s "$kernel_dir/vmlinuz" ]]; then
    log "  present: $kernel_dir/vmlinuz"
else
    kernel_pkg="$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-/ { print $2; exit }')"
    [[ -n "$kernel_pkg" ]] || { log "cannot tell which package linux-image-amd64 depends on"; exit 1; }
    download="$(mktemp -d)"
    chmod 755 "$download"   # apt's _apt user downloads into it
    (cd "$download" && apt-get download -qq "$kernel_pkg")
    mkdir -p "$kernel_dir"
    dpkg-deb --fsys-tarfile "$download"/"$kernel_pkg"_*.deb \
        | tar -xO --wildcards './boot/vmlinuz-*' > "$kernel_dir/vmlinuz.part"
    [[ -s "$kernel_dir/vmlinuz.part" ]] || { log "no vmlinuz in $kernel_pkg"; exit 1; }
    mv "$kernel_dir/vmlinuz.part" "$kernel_dir/vmlinuz"
    echo "$kernel_pkg" > "$kernel_dir/package"
    rm -rf "$download"
    log "  $kernel_pkg -> $kernel_dir/vmlinuz"
fi
step_done

# The guest image (debootstrap: mostly downloads and dpkg, ~4 min cold) builds beside the Go
# build (CPU-bound, ~10 min cold); both are cached by the hash of their inputs. debootstrap needs
# root.
step "guest image" "proxy VM guest image (tests/fixtures/guest-image/build.sh), in the background"
image_start=$step_start
image_out="$(mktemp)"
as_root env PROXY_OPERATOR_FIXTURES="${PROXY_OPERATOR_FIXTURES:-$HOME/.cache/proxy-operator/fixtures}" \
    "$repo/tests/fixtures/guest-image/build.sh" >"$image_out" &
image_pid=$!

step "Go binaries" "kube-apiserver, kubectl, etcd, kubelet, controller-manager, scheduler, kube-proxy (tests/fixtures/k8s/build.sh)"
bin="$("$repo/tests/fixtures/k8s/build.sh" | tail -n1)"
step_done

# The chart's tests (host/tests/deploy/helm.rs, host/tests/cluster_e2e/helm.rs): helm from its Go
# module, as the Kubernetes binaries are (after them: both are CPU-bound).
step "helm" "helm (tests/fixtures/helm/build.sh)"
helm_bin="$("$repo/tests/fixtures/helm/build.sh" | tail -n1)"
step_done

# The release's SBOM (.ci/release.sh, host/tests/deploy/release.rs): cargo-cyclonedx, pinned,
# with its own Cargo.lock (cargo install --locked), after the Go builds (CPU-bound as well).
step "cargo-cyclonedx" "cargo-cyclonedx (tests/fixtures/cargo-cyclonedx/install.sh)"
cyclonedx_bin="$("$repo/tests/fixtures/cargo-cyclonedx/install.sh" | tail -n1)"
step_done

# After the Go build: pause.c comes from its module cache.
step "node images" "node images: pause, squid, web (tests/fixtures/node-images/build.sh)"
node_images="$(as_root env PROXY_OPERATOR_FIXTURES="${PROXY_OPERATOR_FIXTURES:-$HOME/.cache/proxy-operator/fixtures}" \
    GOMODCACHE="$(go env GOMODCACHE)" PATH="$PATH" "$repo/tests/fixtures/node-images/build.sh" | tail -n1)"
step_done

step "waiting for the guest image" "waiting for the guest image"
if ! wait "$image_pid"; then
    log "building the guest image failed (its output is above)"
    exit 1
fi
guest_image="$(tail -n1 "$image_out")"
rm -f "$image_out"
step_done
record "guest image (beside the Go build)" "$image_start"

log "all fixtures present in $(elapsed "$total_start") s; k8s binaries: $bin; helm: $helm_bin; cargo-cyclonedx: $cyclonedx_bin; guest image: $guest_image; node images: $node_images"
