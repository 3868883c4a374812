#!/usr/bin/env bash
# Packs what a release publishes, into DIR (default: target/platforms/packages):
#   - one tarball per platform package under npm/ (its binary copied in from the root, where
#     `npm run build:all` puts it; a platform whose binary is not built is left out), named
#     trueforge-docker-sandbox-<platform>-<version>.tgz;
#   - the main package, main.tgz, with the `optionalDependencies` that `napi prepublish` writes
#     into it at publish time (one per `napi.targets` entry, at the package's version). They are
#     not in the repository's package.json because `npm ci` refuses optional dependencies that
#     are not published yet.
# The main package carries no addon binary (npm installs the platform package that matches the
# machine's os/cpu/libc), but does carry the in-sandbox agent's (agent-bin/, npm run build:agent).
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(realpath -m "${1:-target/platforms/packages}")
rm -rf "$out"
mkdir -p "$out/stage"

bin=$(node -p "require('./package.json').napi.binaryName")
for dir in npm/*/; do
  plat=$(basename "$dir")
  src="$bin.$plat.node"
  if [ ! -f "$src" ]; then
    echo "[pack] no $src (npm run build:all makes every one): $plat not packed" >&2
    continue
  fi
  cp "$src" "$dir"
  (cd "$dir" && npm pack --silent --pack-destination "$out" >/dev/null)
done

tarball=$(npm pack --silent --pack-destination "$out/stage" | tail -n 1)
tar xzf "$out/stage/$tarball" -C "$out/stage"
if tar tzf "$out/stage/$tarball" | grep -q '\.node$'; then
  echo "the main package must not carry a binary" >&2; exit 1
fi
# It does carry the in-sandbox agent: Linux binaries for the sandbox, the same on every platform.
listing=$(tar tzf "$out/stage/$tarball")
for arch in x86_64 aarch64; do
  if ! grep -qx "package/agent-bin/trueforge-agent-$arch" <<<"$listing"; then
    echo "the main package must carry agent-bin/trueforge-agent-$arch (npm run build:agent)" >&2; exit 1
  fi
done
node - "$out/stage/package/package.json" <<'EOF'
const fs = require('node:fs')
const file = process.argv[2]
const pkg = JSON.parse(fs.readFileSync(file, 'utf8'))
const names = { x86_64: 'x64', aarch64: 'arm64' }
pkg.optionalDependencies = {}
for (const triple of pkg.napi.targets) {
  const [arch, , os, abi] = triple.split('-')
  const plat = os === 'darwin' ? `darwin-${names[arch]}` : `${os}-${names[arch]}-${abi}`
  pkg.optionalDependencies[`${pkg.name}-${plat}`] = pkg.version
}
fs.writeFileSync(file, JSON.stringify(pkg, null, 2) + '\n')
EOF
(cd "$out/stage/package" && npm pack --silent --pack-destination "$out" >/dev/null)
mv "$out/$tarball" "$out/main.tgz"
rm -rf "$out/stage"
ls -l "$out" | awk 'NR > 1 { printf "[pack] %-55s %9d bytes\n", $9, $5 }'
