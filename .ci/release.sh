#!/usr/bin/env bash
# `make release VERSION=x.y.z`: the release's artifacts in dist/ (or $DIST), and SHA256SUMS over
# them (docs/image.md, "Release"):
#
#   proxy-operator-x.y.z.oci.tar      the operator's image, the Dockerfile's full build
#                                     (tests/fixtures/operator-image/build.sh), checked (check.sh);
#                                     reference IMAGE_REPOSITORY:vx.y.z
#   install.yaml                      one manifest: the CRDs and everything `kubectl kustomize
#                                     deploy/` renders, the image pinned by the archive's digest
#                                     (IMAGE_REPOSITORY@sha256:…)
#   proxy-operator-x.y.z.tgz          the Helm chart, packaged: version and appVersion x.y.z,
#                                     image IMAGE_REPOSITORY, tag vx.y.z (the appVersion's)
#   proxy-operator-x.y.z.cdx.json     a CycloneDX SBOM of the operator binary (cargo-cyclonedx,
#                                     tests/fixtures/cargo-cyclonedx/install.sh)
#   LICENSE                           the project's licence (Apache-2.0), also inside the chart
#                                     package (and the krew archive, deploy/krew/package.sh)
#   SHA256SUMS                        `sha256sum -c SHA256SUMS` checks a download
#
# VERSION is SemVer without a leading v and must be the workspace's version (Cargo.toml), which
# the binary reports (`proxy-operator --version`, with the git commit). Environment:
#   IMAGE_REPOSITORY  where the image is pushed and install.yaml and the chart pull it from
#                     (default proxy-operator, as the chart's values; e.g. ghcr.io/you/proxy-operator)
#   CARGO_PROFILE     the binary's profile in the image (default release; image-ci is cheaper,
#                     for trying the script, not for a release)
#   DIST              the output directory (default dist/, made anew; another must be empty)
#   RELEASE_IMAGE_ARCHIVE  an image archive to release instead of building one (the tests give
#                     the prebuilt test image, so a release test does not compile everything
#                     again; a real release leaves it unset)
# Progress on stderr, the output directory as the last line on stdout. Needs what build.sh
# needs (root, buildah), and the fixtures kubectl, helm and cargo-cyclonedx (built or installed
# on first use).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
version="${1:-${VERSION:-}}"
dist="${DIST:-$repo/dist}"
repository="${IMAGE_REPOSITORY:-proxy-operator}"
log() { printf '[release] %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }
now() { echo "${EPOCHREALTIME/,/.}"; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

# The workspace's version, which the binary reports.
crate_version="$(awk -F'"' '/^\[workspace.package\]/ { w = 1 } w && /^version *=/ { print $2; exit }' "$repo/Cargo.toml")"
[[ -n $version ]] || die "VERSION is missing: make release VERSION=$crate_version (the workspace's version, Cargo.toml)"
[[ $version =~ ^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$ ]] ||
    die "VERSION must be x.y.z (SemVer, no leading v): got '${version}'"
[[ $version == "$crate_version" ]] ||
    die "VERSION $version is not the workspace's version $crate_version, which \`proxy-operator --version\` reports: set version = \"$version\" under [workspace.package] in Cargo.toml (and commit it) first, or release $crate_version"
# host[:port]/path, lower case, no tag (a colon after the last slash) and no digest.
last="${repository##*/}"
[[ $repository =~ ^[a-z0-9]+([._/:-][a-z0-9]+)*$ && $last != *:* ]] ||
    die "IMAGE_REPOSITORY must be an image name without tag or digest (e.g. ghcr.io/you/proxy-operator): got '$repository'"

if ! git -C "$repo" diff --quiet HEAD -- 2>/dev/null; then
    log "warning: the checkout has uncommitted changes: the image's revision (label, --version) ends in -dirty; release a commit"
fi

total=$(now)
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# dist/ is made anew; another directory must be empty (nothing of the user's is removed).
if [[ $dist == "$repo/dist" ]]; then
    rm -rf "$dist"
elif [[ -n "$(ls -A "$dist" 2>/dev/null)" ]]; then
    die "DIST=$dist is not empty"
fi
mkdir -p "$dist"

log "tools: kubectl, helm, cargo-cyclonedx (fixtures)"
kubectl="$("$repo/tests/fixtures/k8s/build.sh" | tail -n1)/kubectl"
helm="$("$repo/tests/fixtures/helm/build.sh" | tail -n1)/helm"
cyclonedx_bin="$("$repo/tests/fixtures/cargo-cyclonedx/install.sh" | tail -n1)"

# 1. The image: the full Dockerfile build, checked, or the archive given.
image="$dist/proxy-operator-$version.oci.tar"
t=$(now)
if [[ -n ${RELEASE_IMAGE_ARCHIVE:-} ]]; then
    [[ -f $RELEASE_IMAGE_ARCHIVE ]] || die "RELEASE_IMAGE_ARCHIVE=$RELEASE_IMAGE_ARCHIVE is not a file"
    log "image: $RELEASE_IMAGE_ARCHIVE as given (RELEASE_IMAGE_ARCHIVE; not built here)"
    cp "$RELEASE_IMAGE_ARCHIVE" "$image"
else
    name="$repository"
    # The name as a registry resolves it (`ctr images import` keeps what the archive says).
    first="${name%%/*}"
    if [[ $name != */* ]]; then
        name="docker.io/library/$name"
    elif [[ $first != *.* && $first != *:* && $first != localhost ]]; then
        name="docker.io/$name"
    fi
    log "image: the Dockerfile's full build as $name:v$version (CARGO_PROFILE=${CARGO_PROFILE:-release}; long when cold, docs/image.md)"
    built="$(IMAGE_REF="$name:v$version" "$repo/tests/fixtures/operator-image/build.sh" | tail -n1)"
    "$repo/tests/fixtures/operator-image/check.sh" "$built"
    cp "$built" "$image"
fi
# The digest a registry keeps when the archive is copied as it is (skopeo copy
# --preserve-digests): its image manifest's.
index="$(tar -xOf "$image" index.json)" || die "$image has no index.json: not an OCI archive"
digest="$(jq -r '.manifests[0].digest // ""' <<<"$index")"
media="$(jq -r '.manifests[0].mediaType // ""' <<<"$index")"
[[ $digest =~ ^sha256:[0-9a-f]{64}$ ]] || die "$image: no image manifest digest in its index.json"
[[ $media == application/vnd.oci.image.manifest.v1+json ]] ||
    die "$image: its index names a $media, not an image manifest"
log "  $(basename "$image"): $digest ($(du -h "$image" | cut -f1)) in $(elapsed "$t") s"

# 2. install.yaml: deploy/ as kubectl kustomize renders it, the image pinned by that digest.
t=$(now)
overlay="$work/install"
mkdir -p "$overlay"
cat >"$overlay/kustomization.yaml" <<YAML
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - $(realpath --relative-to="$overlay" "$repo/deploy")
images:
  - name: proxy-operator
    newName: $repository
    digest: $digest
YAML
{
    echo "# proxy-operator $version: the CRDs and the operator, as \`kubectl apply -k deploy/\` installs"
    echo "# them, the image pinned by digest ($repository@$digest)."
    echo "#   kubectl apply -f install.yaml"
    echo "# Then the providers config (ConfigMap proxy-operator/providers-config), the discovery API's"
    echo "# TLS Secret and, optionally, its token: README \"With a release manifest\"."
    "$kubectl" kustomize "$overlay"
} >"$dist/install.yaml"
grep -q "image: $repository@$digest\$" "$dist/install.yaml" ||
    die "install.yaml does not pin $repository@$digest (deploy/kustomization.yaml's images entry changed?)"
log "  install.yaml: $(grep -c '^kind:' "$dist/install.yaml") objects in $(elapsed "$t") s"

# 3. The chart with its links resolved (LICENSE among them), the release's repository as the
# default; the image's tag defaults to v<appVersion>, set by --app-version.
t=$(now)
cp -rL "$repo/deploy/helm/proxy-operator" "$work/proxy-operator"
values="$work/proxy-operator/values.yaml"
sed -i -e "s|^  repository: proxy-operator\$|  repository: $repository|" "$values"
grep -qx '  tag: ""' "$values" || die "no '  tag: \"\"' line in $values: the chart would not default to the release's tag"
grep -qx "  repository: $repository" "$values" || die "no '  repository: proxy-operator' line in $values to set"
"$helm" lint --strict "$work/proxy-operator" >&2
"$helm" package "$work/proxy-operator" --version "$version" --app-version "$version" -d "$dist" >&2
log "  chart packaged in $(elapsed "$t") s"

# 4. The SBOM of the binary the default image holds (`-p proxy-operator --bin proxy-operator
# --no-default-features`, as the Dockerfile builds it: no libvirt), for the image's platform, its dev-dependencies left out. cargo-cyclonedx writes
# beside each member's Cargo.toml: it runs on a copy of the sources, so nothing is written into
# the checkout (and two releases at once do not meet). SOURCE_DATE_EPOCH (the commit's time):
# the same sources give the same SBOM (no random serial number).
t=$(now)
src="$work/src"
mkdir -p "$src"
tar -C "$repo" --exclude=./.git --exclude=./target --exclude=./dist --exclude='*/target' \
    --exclude='*/node_modules' --exclude='*/.venv' -cf - . | tar -C "$src" -xf -
epoch="$(git -C "$repo" log -1 --format=%ct 2>/dev/null || date +%s)"
(cd "$src" && SOURCE_DATE_EPOCH="$epoch" PATH="$cyclonedx_bin:$PATH" cargo cyclonedx --quiet \
    --manifest-path host/Cargo.toml --no-default-features --describe binaries --format json \
    --spec-version 1.5 \
    --target "$(rustc -vV | sed -n 's/^host: //p')") >&2 || die "cargo cyclonedx failed"
sbom="$src/host/proxy-operator_bin.cdx.json"
[[ -f $sbom ]] || die "cargo cyclonedx wrote no $sbom: $(cd "$src/host" && ls ./*.cdx.json 2>&1 | xargs)"
mv "$sbom" "$dist/proxy-operator-$version.cdx.json"
log "  SBOM: $(jq '.components | length' "$dist/proxy-operator-$version.cdx.json") components in $(elapsed "$t") s"

cp "$repo/LICENSE" "$dist/LICENSE"
(cd "$dist" && sha256sum -- * >SHA256SUMS)
log "wrote $dist in $(elapsed "$total") s:"
ls -l "$dist" >&2
echo "$dist"
