#!/usr/bin/env bash
# `npm run build:all`: the release binary for every `napi.targets` entry in package.json, each
# written to the root as trueforge-docker-sandbox.<platform>.node (scripts/build/pack-platforms.sh puts
# them into the platform packages under npm/).
# - This machine's own target builds with the host toolchain, as `npm run build` does (same
#   target dir, so after `npm run build` it is already fresh).
# - Every other target cross-compiles with `napi build --cross-compile`, i.e. cargo-zigbuild with
#   zig as the C compiler and linker: glibc for Linux and libSystem for macOS come from zig's own
#   stubs, so no sysroot or macOS SDK is needed (the crate links no system framework).
#   zig and cargo-zigbuild are PyPI packages, installed into a virtual environment under
#   target/platforms/tools (pinned versions below); the Rust targets through rustup.
# macOS minimum versions: 10.15 on x86-64 (Node.js 20's floor) and 11.0 on arm64 (the first
# arm64 macOS). Set TARGETS to build a subset (space-separated triples).
set -euo pipefail
cd "$(dirname "$0")/../.."

ZIGLANG_VERSION=0.17.1
CARGO_ZIGBUILD_VERSION=0.24.1

host=$(rustc -vV | sed -n 's/^host: //p')
mapfile -t all < <(node -p "require('./package.json').napi.targets.join('\n')")
read -r -a targets <<<"${TARGETS:-${all[*]}}"

log() { printf '[build-all] %s\n' "$*"; }

cross=0
for t in "${targets[@]}"; do [ "$t" = "$host" ] || cross=1; done
if [ "$cross" = 1 ]; then
  venv=target/platforms/tools
  if ! "$venv/bin/python" -m pip show "ziglang==$ZIGLANG_VERSION" >/dev/null 2>&1 ||
    [ "$("$venv/bin/cargo-zigbuild" --version 2>/dev/null)" != "cargo-zigbuild $CARGO_ZIGBUILD_VERSION" ]; then
    log "installing ziglang $ZIGLANG_VERSION and cargo-zigbuild $CARGO_ZIGBUILD_VERSION (PyPI) into $venv"
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
      "ziglang==$ZIGLANG_VERSION" "cargo-zigbuild==$CARGO_ZIGBUILD_VERSION"
  fi
  export PATH="$PWD/$venv/bin:$PATH"
  installed=$(rustup target list --installed)
  for t in "${targets[@]}"; do
    grep -qx "$t" <<<"$installed" || rustup target add "$t"
  done
fi

for t in "${targets[@]}"; do
  # This machine's target: exactly `npm run build` (no --target), or napi's type-definition
  # cache key differs and the two builds keep invalidating each other.
  flags=()
  env=()
  [ "$t" = "$host" ] || flags=(--target "$t" --cross-compile)
  case "$t" in
    x86_64-apple-darwin) env=(MACOSX_DEPLOYMENT_TARGET=10.15) ;;
    aarch64-apple-darwin) env=(MACOSX_DEPLOYMENT_TARGET=11.0) ;;
  esac
  start=$(date +%s)
  # --js/--dts as in `npm run build`: the generated loader and types are the same for every
  # target, and without them napi would write index.js and index.d.ts, which are hand-written.
  env "${env[@]}" npx napi build --platform --release "${flags[@]}" \
    --js binding.js --dts binding.d.ts
  log "$t built in $(($(date +%s) - start)) s"
done
