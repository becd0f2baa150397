#!/usr/bin/env bash
# Builds the Python example provider into target/plugins/python-example.wasm.
#
# componentize-py bundles CPython and the standard library into the component and generates the
# bindings for the WIT world itself, so app.py needs nothing else. A venv under target/ holds the
# pinned tool; it is made once and reused.
set -euo pipefail

COMPONENTIZE_PY_VERSION=0.25.1

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../../.." && pwd)"
venv="$repo/target/examples-venv"
out="$repo/target/plugins/python-example.wasm"
tool="$venv/bin/componentize-py"

if ! "$tool" --version 2>/dev/null | grep -qx "componentize-py $COMPONENTIZE_PY_VERSION"; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check "componentize-py==$COMPONENTIZE_PY_VERSION"
fi

# Bindings for editors and type checkers (the build does not need them): target/examples-venv/bindings.
if [ ! -d "$venv/bindings/wit_world" ] || [ -n "$(find "$repo/wit/since_v0.1.0" -newer "$venv/bindings/wit_world" -print -quit)" ]; then
    rm -rf "$venv/bindings"
    "$tool" -d "$repo/wit/since_v0.1.0" -w provider-plugin bindings "$venv/bindings" >/dev/null
fi

# Rebuild only when the app, this script or the WIT changed since the last build.
if [ -f "$out" ] && [ -z "$(find "$here" "$repo/wit/since_v0.1.0" -newer "$out" \( -name '*.py' -o -name '*.sh' -o -name '*.wit' \) -print -quit)" ]; then
    echo "up to date"
else
    # Build from a copy: componentize-py runs the app once at build time (in wasm, with the app's
    # directory mounted) and would leave a __pycache__ next to the sources.
    stage="$venv/app"
    rm -rf "$stage" && mkdir -p "$stage" "$(dirname "$out")"
    cp "$here"/*.py "$stage"/
    cd "$stage"
    "$tool" -d "$repo/wit/since_v0.1.0" -w provider-plugin componentize app -p "$stage" -o "$out"
fi
ls -l "$out" | awk -v f="${out#"$repo"/}" '{ printf "%s: %d bytes (%.1f MB)\n", f, $5, $5 / 1048576 }'
