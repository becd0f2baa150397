#!/bin/sh
# Packs a built kubectl-px for krew: target/krew/kubectl-px_<os>_<arch>.tar.gz (the binary and
# the project's LICENSE at its root, as krew's checklist wants) and target/krew/px.yaml, deploy/krew/px.yaml with only that platform, its sha256
# and a file:// URI, so that
#   kubectl krew install --manifest=target/krew/px.yaml --archive=target/krew/kubectl-px_<os>_<arch>.tar.gz
# installs it. KUBECTL_PX: the binary (default target/release/kubectl-px, built by
# `cargo build --release -p proxy-operator --bin kubectl-px`); OUT: the directory.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
binary=${KUBECTL_PX:-$root/target/release/kubectl-px}
out=${OUT:-$root/target/krew}
[ -x "$binary" ] || { echo "package.sh: no $binary; build it: cargo build --release -p proxy-operator --bin kubectl-px" >&2; exit 1; }
os=$(uname -s | tr 'A-Z' 'a-z')
case $(uname -m) in
  x86_64 | amd64) arch=amd64 ;;
  aarch64 | arm64) arch=arm64 ;;
  *) echo "package.sh: no krew platform for $(uname -m)" >&2; exit 1 ;;
esac
mkdir -p "$out"
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
cp "$binary" "$stage/kubectl-px"
cp "$root/LICENSE" "$stage/LICENSE"
archive="$out/kubectl-px_${os}_${arch}.tar.gz"
tar -C "$stage" -czf "$archive" kubectl-px LICENSE
sum=$(sha256sum "$archive" | cut -d' ' -f1)
# Keep the manifest's head and the one platform block of this os/arch.
awk -v os="$os" -v arch="$arch" -v sum="$sum" -v base="file://$out" '
  function flush() { if (block != "" && block ~ ("os: " os "\n") && block ~ ("arch: " arch "\n")) printf "%s", block; block = "" }
  /^    - selector:/ { flush(); inblock = 1 }
  inblock { line = $0; gsub("BASE_URL", base, line); sub("SHA256_" os "_" arch, sum, line); block = block line "\n"; next }
  { print }
  END { flush() }
' "$here/px.yaml" > "$out/px.yaml"
echo "$archive"
echo "$out/px.yaml"
