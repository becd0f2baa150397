#!/usr/bin/env bash
# Builds the JavaScript example provider into target/plugins/js-example.wasm.
#
# componentize-js embeds the SpiderMonkey engine (StarlingMonkey) in the component, pre-initialised
# with app.js, and generates the bindings for the WIT world itself, so app.js needs nothing else.
# The pinned tool (package.json + package-lock.json beside this script) is installed with `npm ci`
# into target/examples-node once, and again only when the lock file changes.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../../.." && pwd)"
tools="$repo/target/examples-node"
out="$repo/target/plugins/js-example.wasm"
tool="$tools/node_modules/.bin/componentize-js"

# componentize-js 0.23's dependencies declare Node.js >= 20.19 (Debian bookworm's nodejs is 18).
if ! node -e 'const [a, b] = process.versions.node.split(".").map(Number); process.exit(a > 20 || (a === 20 && b >= 19) ? 0 : 1)' 2>/dev/null; then
    echo "plugins/examples/js: needs Node.js >= 20.19 and npm on PATH (found: $(node --version 2>/dev/null || echo none))" >&2
    exit 1
fi

if ! cmp -s "$here/package-lock.json" "$tools/package-lock.json" || [ ! -x "$tool" ]; then
    rm -rf "$tools" && mkdir -p "$tools"
    cp "$here/package.json" "$here/package-lock.json" "$tools"/
    (cd "$tools" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error)
fi

# Rebuild only when the app, this script, the lock file or the WIT changed since the last build.
if [ -f "$out" ] && [ -z "$(find "$here" "$repo/wit/since_v0.1.0" -newer "$out" \( -name '*.js' -o -name '*.sh' -o -name '*.wit' -o -name 'package-lock.json' \) -print -quit)" ]; then
    echo "up to date"
else
    mkdir -p "$(dirname "$out")"
    # The host links WASI 0.2 without wasi:http, so the engine's fetch() (`http`) and its
    # incoming-handler (`fetch-event`) are left out; outbound HTTP goes through the http capability.
    "$tool" "$here/app.js" --wit "$repo/wit/since_v0.1.0" --world-name provider-plugin \
        --disable http fetch-event --out "$out.tmp"
    mv "$out.tmp" "$out"
fi
ls -l "$out" | awk -v f="${out#"$repo"/}" '{ printf "%s: %d bytes (%.1f MB)\n", f, $5, $5 / 1048576 }'
