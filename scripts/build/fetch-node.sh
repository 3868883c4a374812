#!/usr/bin/env bash
# Prints the path of a Node.js binary of the given major version and CPU (x64 or arm64, Linux),
# fetching it once into CACHE (default: target/platforms/node): the npm package
# node-linux-<cpu>@<major> (what npm's `node` package installs per platform), packed and unpacked
# with npm itself, so no other download site is needed.
# Usage: scripts/build/fetch-node.sh <x64|arm64> <major> [CACHE]
set -euo pipefail
cpu=$1 major=$2
cache=$(realpath -m "${3:-$(dirname "$0")/../../target/platforms/node}")
dir="$cache/linux-$cpu-$major"
if [ ! -x "$dir/package/bin/node" ]; then
  rm -rf "$dir"
  mkdir -p "$dir"
  tarball=$(cd "$dir" && npm pack --silent "node-linux-$cpu@$major" | tail -n 1)
  tar xzf "$dir/$tarball" -C "$dir"
  rm -f "$dir/$tarball"
  echo "[node] fetched node-linux-$cpu@$(node -p "require('$dir/package/package.json').version")" >&2
fi
echo "$dir/package/bin/node"
