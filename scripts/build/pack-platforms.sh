#!/usr/bin/env bash
# Prepares a release: copies each built binary into its platform package under npm/ (where
# `napi prepublish`, run by `npm publish`, expects it), then packs all five packages into DIR
# (default: target/platforms/packages) with scripts/build/pack.sh.
# To pack without writing into the checkout, run `npm run pack` (scripts/build/pack.sh) instead.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-target/platforms/packages}

bin=$(node -p "require('./package.json').napi.binaryName")
for dir in npm/*/; do
  src="$bin.$(basename "$dir").node"
  if [ -f "$src" ]; then cp "$src" "$dir"; fi
done
exec bash scripts/build/pack.sh --out "$out"
