#!/usr/bin/env bash
# Installs the packed packages (scripts/build/pack-platforms.sh) into an empty project per Node.js
# version and runs one exec (scripts/ci/smoke-installed.js) and the contract
# (scripts/ci/contract-installed.js) through the installed package against the running engine.
#   --cpu x64    (default) this machine's Node.js builds of each version
#   --cpu arm64  arm64 Linux: npm chooses the package for --cpu=arm64, and the arm64 Node.js runs
#                under qemu-user (qemu-aarch64-static), with Debian's arm64 glibc, libstdc++ and
#                libgcc from the *-arm64-cross packages as its root (-L /usr/aarch64-linux-gnu)
# The install is scripts/ci/install-packed.sh: npm itself picks the platform package, and this
# checks that it picked this platform's and no other. Node.js versions: NODE_MAJORS (default
# "20 22 24").
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
cpu=x64
[ "${1:-}" = "--cpu" ] && { cpu=$2; shift 2; }
packages=$(realpath -m "${1:-target/platforms/packages}")
work="$root/target/platforms/consumers"
plat="linux-$cpu-gnu"

log() { printf '[%s] %s\n' "$plat" "$*"; }

run=()
if [ "$cpu" = arm64 ]; then
  sysroot=/usr/aarch64-linux-gnu
  need=(qemu-user-static libc6-arm64-cross libstdc++6-arm64-cross libgcc-s1-arm64-cross)
  if ! dpkg -s "${need[@]}" >/dev/null 2>&1; then
    log "installing ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null 2>&1 ||
      { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null; }
  fi
  run=(qemu-aarch64-static -L "$sysroot")
  npm_flags=(--cpu=arm64 --os=linux --libc=glibc)
elif [ "$cpu" = x64 ]; then
  npm_flags=()
else
  echo "unknown cpu $cpu" >&2; exit 2
fi

for major in ${NODE_MAJORS:-20 22 24}; do
  node=$(bash scripts/build/fetch-node.sh "$cpu" "$major")
  # npm itself runs on this machine's Node.js of the same version.
  host_node=$(bash scripts/build/fetch-node.sh x64 "$major")
  dir="$work/$plat-node$major"
  rm -rf "$dir"
  mkdir -p "$dir"
  start=$(date +%s)
  PATH="$(dirname "$host_node"):$PATH" NPM_INSTALL_FLAGS="${npm_flags[*]}" \
    bash scripts/ci/install-packed.sh "$dir" "$packages"
  installed=$(cd "$dir/node_modules" && ls -d trueforge-docker-sandbox* | tr '\n' ' ')
  if [ "$installed" != "trueforge-docker-sandbox trueforge-docker-sandbox-$plat " ]; then
    echo "npm installed '$installed', expected the main package and trueforge-docker-sandbox-$plat only" >&2
    exit 1
  fi
  log "Node.js $("${run[@]}" "$node" --version): npm installed ${installed% } in $(($(date +%s) - start)) s"
  start=$(date +%s)
  (cd "$dir" && "${run[@]}" "$node" "$root/scripts/ci/smoke-installed.js" && "${run[@]}" "$node" "$root/scripts/ci/contract-installed.js" "$plat")
  log "Node.js $major: exec and contract passed in $(($(date +%s) - start)) s"
done
