#!/usr/bin/env bash
# The platform part of .ci/run (after `npm run build`): every binary built and checked, the
# packages packed as a release publishes them, and the packed main package installed with its
# platform package and run (one exec and the contract, against the engine) on Node.js 20, 22
# and 24, on x86-64 and, under qemu-user, on arm64 Linux. The macOS binaries are checked but
# cannot run here. Downloads (zig, cargo-zigbuild, Node.js builds) are kept under
# target/platforms, so a second run in the same checkout fetches nothing.
set -euo pipefail
cd "$(dirname "$0")/../.."

t0=$(date +%s)
lap() { printf '[platforms] %s: %d s\n' "$1" "$(($(date +%s) - t0))"; t0=$(date +%s); }

bash scripts/build/build-all.sh
lap "build:all (4 targets)"
bash scripts/build/check-binaries.sh
lap "binary checks"
bash scripts/build/pack-platforms.sh target/platforms/packages
lap "pack"
bash scripts/ci/install-matrix.sh --cpu x64 target/platforms/packages
lap "x86-64: install + exec + contract on Node.js 20/22/24"
bash scripts/ci/install-matrix.sh --cpu arm64 target/platforms/packages
lap "arm64 under qemu: install + exec + contract on Node.js 20/22/24"
