#!/usr/bin/env bash
# `make release VERSION=x.y.z`: the release's artifacts in dist/ (or $DIST), and SHA256SUMS over
# them. So far: the Helm chart, packaged (`helm package`) as proxy-operator-x.y.z.tgz, its
# version and appVersion x.y.z and its default image tag vx.y.z (the chart in the repository
# defaults to `dev`, as deploy/kustomization.yaml does). The CRD and monitoring files are copied
# out of deploy/ (the chart's files/ links there). helm is the fixture (tests/fixtures/helm).
# Other artifacts (issue #32 item 3: install.yaml, the image, an SBOM) go beside it.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
version="${1:-${VERSION:-}}"
dist="${DIST:-$repo/dist}"
log() { printf '[release] %s\n' "$*" >&2; }

[[ $version =~ ^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$ ]] ||
    { log "VERSION must be x.y.z (SemVer, no leading v): got '${version}'"; exit 1; }

helm="$("$repo/tests/fixtures/helm/build.sh" | tail -n1)/helm"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# dist/ is made anew; another directory must be empty (nothing of the user's is removed).
if [[ $dist == "$repo/dist" ]]; then
    rm -rf "$dist"
elif [[ -n "$(ls -A "$dist" 2>/dev/null)" ]]; then
    log "DIST=$dist is not empty"
    exit 1
fi
mkdir -p "$dist"

# The chart with its links resolved and the release's image tag as the default.
cp -rL "$repo/deploy/helm/proxy-operator" "$work/proxy-operator"
values="$work/proxy-operator/values.yaml"
sed -i "s/^  tag: dev\$/  tag: v$version/" "$values"
grep -qx "  tag: v$version" "$values" || { log "no '  tag: dev' line in $values to set"; exit 1; }
"$helm" lint --strict "$work/proxy-operator" >&2
"$helm" package "$work/proxy-operator" --version "$version" --app-version "$version" -d "$dist" >&2

(cd "$dist" && sha256sum -- * >SHA256SUMS)
log "wrote $dist:"
ls -l "$dist" >&2
echo "$dist"
