#!/usr/bin/env bash
# Installs the packed tarball into an empty project and uses it as a consumer would: one exec
# through `require`, every public name imported by name from an ES module plus an exec, and a
# TypeScript type check with `module: nodenext` from .mts and .cts files. `NODE` picks the node
# binary (default: the one on PATH).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
node=${NODE:-node}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# The main package and this platform's package, as npm picks it (scripts/ci/install-packed.sh).
bash "$root/scripts/ci/install-packed.sh" "$tmp/consumer"
cd "$tmp/consumer"
"$node" "$root/scripts/ci/smoke-installed.js"
cp "$root"/scripts/ci/consumer/* .
"$node" esm-smoke.mjs
mkdir -p node_modules/@types
ln -s "$root/node_modules/@types/node" node_modules/@types/node
"$node" "$root/node_modules/typescript/bin/tsc" -p tsconfig.json
echo "TypeScript (module nodenext) resolves every import from .mts and .cts"
