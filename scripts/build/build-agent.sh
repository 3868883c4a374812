#!/usr/bin/env bash
# The in-sandbox agent as static, stripped Linux binaries (musl), one per architecture:
#   target/agent/trueforge-agent-x86_64
#   target/agent/trueforge-agent-aarch64
# Both link with rust-lld, which rustup ships with every toolchain, and musl's self-contained
# startup files and libc from the Rust targets: no C cross compiler, zig or sysroot is needed (the
# agent links no C code). The 'agent-release' cargo profile (Cargo.toml) makes them small: opt-level s,
# LTO, one codegen unit, panic abort, symbols stripped.
# Then copies them into agent-bin/, which the npm package carries (`npm run build:agent`).
# ARCHS picks a subset (space-separated: x86_64 aarch64). CHECK=1 also runs the agent's tests
# against each binary (the aarch64 one under qemu-user: `apt-get install qemu-user`).
set -euo pipefail
cd "$(dirname "$0")/../.."

read -r -a archs <<<"${ARCHS:-x86_64 aarch64}"
out=target/agent
mkdir -p "$out"
log() { printf '[build-agent] %s\n' "$*"; }

installed=$(rustup target list --installed)
for arch in "${archs[@]}"; do
  triple="$arch-unknown-linux-musl"
  grep -qx "$triple" <<<"$installed" || rustup target add "$triple"
  var="CARGO_TARGET_$(tr 'a-z-' 'A-Z_' <<<"$triple")_LINKER"
  start=$(date +%s)
  env "$var=rust-lld" cargo build --locked -p trueforge-agent --profile agent-release --target "$triple"
  cp "target/$triple/agent-release/trueforge-agent" "$out/trueforge-agent-$arch"
  # A static binary has no program interpreter (the dynamic loader).
  if readelf -l "$out/trueforge-agent-$arch" 2>/dev/null | grep -q 'Requesting program interpreter'; then
    echo "trueforge-agent-$arch is not static" >&2
    exit 1
  fi
  log "$out/trueforge-agent-$arch: $(stat -c %s "$out/trueforge-agent-$arch") bytes, built in $(($(date +%s) - start)) s"
done

if [ "${CHECK:-0}" = 1 ]; then
  for arch in "${archs[@]}"; do
    runner=""
    if [ "$arch" != "$(uname -m)" ]; then
      runner=$(command -v "qemu-$arch" || command -v "qemu-$arch-static" || true)
      [ -n "$runner" ] || { echo "qemu-$arch is needed to test the $arch agent" >&2; exit 1; }
    fi
    log "testing $out/trueforge-agent-$arch${runner:+ under $runner}"
    TRUEFORGE_AGENT_BIN="$PWD/$out/trueforge-agent-$arch" TRUEFORGE_AGENT_RUNNER="$runner" \
      cargo test --locked -p trueforge-agent --tests -- --test-threads=2
  done
fi

# The npm package carries them (package.json `files`; index.js passes this directory to the
# addon): Linux binaries for the sandbox, the same for every host platform.
mkdir -p agent-bin
for arch in "${archs[@]}"; do
  cp "$out/trueforge-agent-$arch" "agent-bin/trueforge-agent-$arch"
done
log "agent-bin/: $(ls agent-bin | tr '\n' ' ')"
