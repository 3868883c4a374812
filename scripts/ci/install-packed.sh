#!/usr/bin/env bash
# Installs the packed packages into DIR the way a consumer gets them from the registry: DIR's
# package.json depends on the main package only, and `overrides` point every platform package at
# its local tarball (as if all were published), so npm itself installs the one whose os/cpu/libc
# match (or match the --cpu/--os/--libc in NPM_INSTALL_FLAGS) and skips the others.
# PACKAGES: a folder made by scripts/build/pack-platforms.sh; without it, the packages are packed into
# DIR/packages first (scripts/build/pack.sh: the platform packages whose binary is built).
# Usage: scripts/ci/install-packed.sh DIR [PACKAGES]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
dir=$(realpath -m "$1")
mkdir -p "$dir"
packages=${2:-}
if [ -z "$packages" ]; then
  packages="$dir/packages"
  bash "$root/scripts/build/pack.sh" --out "$packages" >/dev/null
fi
packages=$(realpath "$packages")
node - "$dir/package.json" "$packages" <<'EOF'
const fs = require('node:fs')
const path = require('node:path')
const [file, packages] = process.argv.slice(2)
const overrides = {}
for (const f of fs.readdirSync(packages)) {
  const m = /^(trueforge-docker-sandbox-.+)-\d+\.\d+\.\d+.*\.tgz$/.exec(f)
  if (m) overrides[m[1]] = `file:${path.join(packages, f)}`
}
const pkg = {
  name: 'consumer',
  version: '1.0.0',
  private: true,
  dependencies: { 'trueforge-docker-sandbox': `file:${path.join(packages, 'main.tgz')}` },
  overrides,
}
fs.writeFileSync(file, JSON.stringify(pkg, null, 2) + '\n')
EOF
# shellcheck disable=SC2086 # NPM_INSTALL_FLAGS is a list of flags
(cd "$dir" && npm install --no-audit --no-fund --loglevel=error ${NPM_INSTALL_FLAGS:-} >/dev/null)
