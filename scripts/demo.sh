#!/usr/bin/env bash
# The main job on a fresh machine: make sure the engine, the TrueForge-ready image, the npm packages
# and the addon exist (each step is skipped when already done), then run the demo.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/engines/ensure-engine.sh
bash scripts/images/ensure-images.sh trueforge
if [ ! -d node_modules/@napi-rs/cli ]; then
  if [ -f package-lock.json ]; then npm ci --no-audit --no-fund; else npm install --no-audit --no-fund; fi
fi
if ! ls ./*.node >/dev/null 2>&1; then npm run build; fi
# The in-sandbox agent serves every call (a few ms an exec); without its binary each call takes
# the engine's endpoints (tens of ms). Build it for this machine's architecture when missing.
arch=$(uname -m)
[ "$arch" = arm64 ] && arch=aarch64
if [ ! -x "agent-bin/trueforge-agent-$arch" ]; then ARCHS=$arch npm run build:agent; fi
exec node scripts/demo.js "$@"
