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
# Like scripts/fault-engine.sh, it shares nothing mutable with other engines: its own socket,
# data root, exec root, pid file, cgroup parent and network namespace (unshare --net, no bridge:
# with --bridge=none in the host's namespace, dockerd would delete the main engine's docker0).
# Sandboxes on it use `network: 'none'`.
#
#   scripts/gpu-engine.sh start      start it (idempotent), wait until it answers, load the image
#   scripts/gpu-engine.sh stop       SIGTERM, wait for it to exit
#   scripts/gpu-engine.sh teardown   remove every container on it, then stop it
#   scripts/gpu-engine.sh status     running / stopped (exit 0 / 3)
#   scripts/gpu-engine.sh host       print its address
set -euo pipefail

SOCK=/var/run/docker-gpu.sock
HOST="unix://$SOCK"
DATA_ROOT=/var/lib/docker-gpu
EXEC_ROOT=/var/run/docker-gpu
PIDFILE=/var/run/docker-gpu.pid
CONFIG=/var/run/docker-gpu.json
HOOK_DIR=/var/lib/docker-gpu-hook
LOG=/tmp/dockerd-gpu.log
IMAGES=(trueforge-sandbox-busybox:1)

log() { printf '[gpu-engine] %s\n' "$*" >&2; }
dk() { docker -H "$HOST" "$@"; }

# Our dockerd's pid, or nothing: the pid file must name a live dockerd using our socket.
engine_pid() {
  [ -f "$PIDFILE" ] || return 0
  local pid
  pid=$(tr -dc '0-9' < "$PIDFILE" 2>/dev/null || true)
  [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] || return 0
  if tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -q -- "$SOCK"; then
    echo "$pid"
  fi
}

answers() { timeout 5 docker -H "$HOST" info >/dev/null 2>&1; }

load_images() {
  local img
  for img in "${IMAGES[@]}"; do
    if dk image inspect "$img" >/dev/null 2>&1; then continue; fi
    if ! docker image inspect "$img" >/dev/null 2>&1; then
      log "image $img is not in the main engine either: run scripts/ensure-images.sh first"
      return 1
    fi
    log "loading $img from the main engine"
    docker save "$img" | dk load >/dev/null
  done
}

start() {
  if [ -z "$(engine_pid)" ]; then
    command -v dockerd >/dev/null 2>&1 || { log "no dockerd: run scripts/ensure-engine.sh first"; exit 1; }
    mkdir -p "$DATA_ROOT" "$EXEC_ROOT" "$HOOK_DIR"
    # The stand-in hook: reads the container state it is given and does nothing.
    printf '#!/bin/sh\ncat >/dev/null 2>&1 || true\nexit 0\n' > "$HOOK_DIR/nvidia-container-runtime-hook"
    chmod 755 "$HOOK_DIR/nvidia-container-runtime-hook"
    echo '{}' > "$CONFIG"
    [ -S "$SOCK" ] && rm -f "$SOCK"
    log "starting dockerd on $HOST with a stand-in nvidia-container-runtime-hook (log: $LOG)"
    PATH="$HOOK_DIR:$PATH" setsid unshare --net dockerd \
      --config-file "$CONFIG" \
      --host "$HOST" \
      --data-root "$DATA_ROOT" \
      --exec-root "$EXEC_ROOT" \
      --pidfile "$PIDFILE" \
      --cgroup-parent /docker-gpu \
      --bridge=none --iptables=false --ip-masq=false --ip-forward=false \
      >>"$LOG" 2>&1 < /dev/null &
  fi
  for _ in $(seq 1 120); do
    if answers; then
      load_images
      log "engine up on $HOST (pid $(engine_pid))"
      return 0
    fi
    sleep 0.5
  done
  log "the GPU test engine did not answer within 60 s; its log ends with:"
  tail -n 30 "$LOG" >&2 || true
  exit 1
}

stop() {
  local pid
  pid=$(engine_pid)
  if [ -z "$pid" ]; then log "not running"; return 0; fi
  log "stopping dockerd $pid"
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 120); do
    if [ ! -d "/proc/$pid" ] || [ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" = Z ]; then
      rm -f "$PIDFILE"
      log "stopped"
      return 0
    fi
    sleep 0.5
  done
  log "dockerd $pid did not exit within 60 s; killing it"
  kill -KILL "$pid" 2>/dev/null || true
  rm -f "$PIDFILE"
}

teardown() {
  local ids
  if [ -n "$(engine_pid)" ] && answers; then
    ids=$(dk ps -aq || true)
    if [ -n "$ids" ]; then
      log "removing $(echo "$ids" | wc -l) container(s)"
      # shellcheck disable=SC2086
      dk rm -f -v $ids >/dev/null || true
    fi
  fi
  stop
}

status() {
  local pid
  pid=$(engine_pid)
  if [ -z "$pid" ]; then echo stopped; exit 3; fi
  if answers; then echo "running (pid $pid, $HOST)"; else echo "not answering (pid $pid)"; fi
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  teardown) teardown ;;
  status) status ;;
  host) echo "$HOST" ;;
  *) echo "usage: $0 start|stop|teardown|status|host" >&2; exit 2 ;;
esac
