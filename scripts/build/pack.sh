#!/usr/bin/env bash
# npm run pack [-- --out DIR]
#
# Packs what a release publishes into DIR (default: target/pack), and writes nothing else: the
# checkout's npm/ folder and package.json are only read.
#   - one tarball per platform package under npm/, from a copy of its folder with the binary put
#     in (the root's trueforge-docker-sandbox.<platform>.node, where `npm run build` puts this
#     machine's and `npm run build:all` every one; a platform whose binary is not built is left
#     out), named trueforge-docker-sandbox-<platform>-<version>.tgz;
#   - the main package, main.tgz, with the `optionalDependencies` that `napi prepublish` writes
#     into it at publish time (one per `napi.targets` entry, at the package's version). They are
#     not in the repository's package.json because `npm ci` refuses optional dependencies that
#     are not published yet.
# The main package carries no addon binary (it does carry the in-sandbox agent's, agent-bin/):
# npm installs the platform package that matches the
# machine's os/cpu/libc. scripts/ci/install-packed.sh installs DIR as the registry would serve it;
# a pnpm project points `pnpm.overrides` (or `overrides:` in pnpm-workspace.yaml) at the files
# (see integrations/trueforge/docs.md).
set -euo pipefail
cd "$(dirname "$0")/../.."

out=target/pack
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=${2:?--out needs a folder}; shift 2 ;;
    --out=*) out=${1#--out=}; shift ;;
    -h | --help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) out=$1; shift ;; # a bare folder, as scripts/build/pack-platforms.sh passes it
  esac
done
out=$(realpath -m "$out")
case "$out" in
  "$(pwd)" | "$(pwd)/npm" | "$(pwd)/npm/"*) echo "[pack] refusing to write into $out (the checkout itself)" >&2; exit 1 ;;
esac
rm -rf "$out"
stage="$out/.stage"
mkdir -p "$stage"
trap 'rm -rf "$stage"' EXIT

bin=$(node -p "require('./package.json').napi.binaryName")
for dir in npm/*/; do
  plat=$(basename "$dir")
  src="$bin.$plat.node"
  if [ ! -f "$src" ]; then
    echo "[pack] no $src (npm run build:all makes every one): $plat not packed" >&2
    continue
  fi
  cp -R "$dir" "$stage/$plat"
  cp "$src" "$stage/$plat/"
  (cd "$stage/$plat" && npm pack --silent --pack-destination "$out" >/dev/null)
done

tarball=$(npm pack --silent --pack-destination "$stage" | tail -n 1)
mkdir -p "$stage/main"
tar xzf "$stage/$tarball" -C "$stage/main"
if tar tzf "$stage/$tarball" | grep '\.node$' >/dev/null; then
  echo "the main package must not carry a binary" >&2
  exit 1
fi
# It does carry the in-sandbox agent: Linux binaries for the sandbox, the same on every platform.
listing=$(tar tzf "$stage/$tarball")
for arch in x86_64 aarch64; do
  if ! grep -qx "package/agent-bin/trueforge-agent-$arch" <<<"$listing"; then
    echo "the main package must carry agent-bin/trueforge-agent-$arch (npm run build:agent)" >&2
    exit 1
  fi
done
node - "$stage/main/package/package.json" <<'EOF'
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
(cd "$stage/main/package" && npm pack --silent --pack-destination "$stage/main" >/dev/null)
mv "$stage/main/$tarball" "$out/main.tgz"
ls -l "$out" | awk 'NR > 1 && $9 ~ /\.tgz$/ { printf "[pack] %-55s %9d bytes\n", $9, $5 }'
