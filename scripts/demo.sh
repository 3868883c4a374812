#!/usr/bin/env bash
# The main job on a fresh machine: make sure the engine, the TrueForge-ready image, the npm packages
# and the addon exist (each step is skipped when already done), then run the demo.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/ensure-engine.sh
bash scripts/ensure-images.sh trueforge
if [ ! -d node_modules/@napi-rs/cli ]; then
  if [ -f package-lock.json ]; then npm ci --no-audit --no-fund; else npm install --no-audit --no-fund; fi
fi
if ! ls ./*.node >/dev/null 2>&1; then npm run build; fi
exec node scripts/demo.js "$@"
