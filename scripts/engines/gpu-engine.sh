#!/usr/bin/env bash
# A second, isolated Docker engine that accepts NVIDIA GPU requests without a GPU, for the
# exclusive-allocation tests (__test__/gpu-alloc.test.ts).
#
# dockerd registers its NVIDIA device driver when a binary named `nvidia-container-runtime-hook`
# is on its PATH; it then accepts device requests with capability `gpu`, runs that binary as a
# prestart hook and gives the container's first process NVIDIA_VISIBLE_DEVICES=<ids>. Here the
# binary is a do-nothing script, so containers get fake GPU ids and no device: everything the
# provider does (requests, environment, labels, allocation) is real, only the GPU is not.
#
# Like scripts/engines/fault-engine.sh, it shares nothing mutable with other engines
# (scripts/lib/test-dockerd.sh).
#
#   scripts/engines/gpu-engine.sh start      start it (idempotent), wait until it answers, load the image
#   scripts/engines/gpu-engine.sh stop       SIGTERM, wait for it to exit
#   scripts/engines/gpu-engine.sh teardown   remove every container on it, then stop it
#   scripts/engines/gpu-engine.sh status     running / stopped (exit 0 / 3)
#   scripts/engines/gpu-engine.sh host       print its address
set -euo pipefail

ENGINE_NAME=gpu
ENGINE_WHAT="GPU test engine"
ENGINE_STARTING_NOTE="with a stand-in nvidia-container-runtime-hook"
HOOK_DIR=/var/lib/docker-gpu-hook
DOCKERD_PATH_PREFIX=$HOOK_DIR
# shellcheck source=../lib/test-dockerd.sh
. "$(dirname "$0")/../lib/test-dockerd.sh"

# The stand-in hook: reads the container state it is given and does nothing.
before_start() {
  mkdir -p "$HOOK_DIR"
  printf '#!/bin/sh\ncat >/dev/null 2>&1 || true\nexit 0\n' > "$HOOK_DIR/nvidia-container-runtime-hook"
  chmod 755 "$HOOK_DIR/nvidia-container-runtime-hook"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  teardown) teardown ;;
  status) status ;;
  host) echo "$HOST" ;;
  *) echo "usage: $0 start|stop|teardown|status|host" >&2; exit 2 ;;
esac
