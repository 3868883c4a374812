# shellcheck shell=bash
# A second, isolated dockerd for a test suite, sourced by scripts/engines/fault-engine.sh and
# scripts/engines/gpu-engine.sh. The sourcing script sets ENGINE_NAME (`faults`, `gpu`: the socket, data
# root, exec root, pid file, config, cgroup parent and log are named after it) and ENGINE_WHAT
# (for messages), and may define `before_start` (run before dockerd starts), set
# DOCKERD_PATH_PREFIX (put first on dockerd's PATH), ENGINE_CONFIG_JSON (the engine's config file,
# default `{}`) and, after sourcing, IMAGES (loaded from the main engine).
#
# The engine shares nothing mutable with any other: its own socket, data root, exec root (and so
# its own managed containerd, runc state and netns), pid file and cgroup parent. It runs in its
# own network namespace (unshare --net) with no bridge and no iptables: with --bridge=none in
# the host's namespace, dockerd would delete the main engine's docker0. Sandboxes on it use
# `network: 'none'`. Every signal goes to the pid in its own pid file, checked first to be a
# dockerd using its socket, so the main engine is never signalled.

SOCK=/var/run/docker-$ENGINE_NAME.sock
HOST="unix://$SOCK"
DATA_ROOT=/var/lib/docker-$ENGINE_NAME
EXEC_ROOT=/var/run/docker-$ENGINE_NAME
PIDFILE=/var/run/docker-$ENGINE_NAME.pid
CONFIG=/var/run/docker-$ENGINE_NAME.json
LOG=/tmp/dockerd-$ENGINE_NAME.log
IMAGES=(trueforge-sandbox-busybox:1)

log() { printf '[%s-engine] %s\n' "${ENGINE_LOG_TAG:-$ENGINE_NAME}" "$*" >&2; }
dk() { docker -H "$HOST" "$@"; }

# Our dockerd's pid, or nothing: the pid file must name a live dockerd whose command line
# carries our socket (a stale pid file never makes us signal someone else's process).
engine_pid() {
  [ -f "$PIDFILE" ] || return 0
  local pid
  pid=$(tr -dc '0-9' < "$PIDFILE" 2>/dev/null || true)
  [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] || return 0
  if tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -q -- "$SOCK"; then
    echo "$pid"
  fi
}

# R, S, T (stopped by SIGSTOP), Z … from /proc/<pid>/stat.
proc_state() { awk '{print $3}' "/proc/$1/stat" 2>/dev/null || true; }

answers() { timeout 5 docker -H "$HOST" info >/dev/null 2>&1; }

load_images() {
  local img
  for img in "${IMAGES[@]}"; do
    if dk image inspect "$img" >/dev/null 2>&1; then continue; fi
    if ! docker image inspect "$img" >/dev/null 2>&1; then
      log "image $img is not in the main engine either: run scripts/images/ensure-images.sh first"
      return 1
    fi
    log "loading $img from the main engine"
    docker save "$img" | dk load >/dev/null
  done
}

start() {
  local pid
  pid=$(engine_pid)
  if [ -n "$pid" ]; then
    if [ "$(proc_state "$pid")" = T ]; then
      log "dockerd $pid is paused; resuming it"
      kill -CONT "$pid"
    fi
  else
    command -v dockerd >/dev/null 2>&1 || { log "no dockerd: run scripts/engines/ensure-engine.sh first"; exit 1; }
    mkdir -p "$DATA_ROOT" "$EXEC_ROOT"
    if declare -F before_start >/dev/null; then before_start; fi
    # A config file of its own (empty unless the sourcing script gives one): options from
    # /etc/docker/daemon.json (hosts, bridge …) meant for the main engine must not leak into this one.
    printf '%s\n' "${ENGINE_CONFIG_JSON:-"{}"}" > "$CONFIG"
    # A stale socket from a killed daemon would make dockerd refuse to start.
    [ -S "$SOCK" ] && rm -f "$SOCK"
    log "starting dockerd on $HOST${ENGINE_STARTING_NOTE:+ $ENGINE_STARTING_NOTE} (log: $LOG)"
    PATH="${DOCKERD_PATH_PREFIX:+$DOCKERD_PATH_PREFIX:}$PATH" setsid unshare --net dockerd \
      --config-file "$CONFIG" \
      --host "$HOST" \
      --data-root "$DATA_ROOT" \
      --exec-root "$EXEC_ROOT" \
      --pidfile "$PIDFILE" \
      --cgroup-parent "/docker-$ENGINE_NAME" \
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
  log "the $ENGINE_WHAT did not answer within 60 s; its log ends with:"
  tail -n 30 "$LOG" >&2 || true
  exit 1
}

stop() {
  local pid
  pid=$(engine_pid)
  if [ -z "$pid" ]; then
    log "not running"
    return 0
  fi
  # A frozen daemon cannot act on SIGTERM.
  [ "$(proc_state "$pid")" = T ] && kill -CONT "$pid" 2>/dev/null || true
  log "stopping dockerd $pid"
  kill -TERM "$pid" 2>/dev/null || true
  # dockerd stops its containers (up to 15 s each, in parallel) and then its containerd.
  for _ in $(seq 1 120); do
    if [ ! -d "/proc/$pid" ] || [ "$(proc_state "$pid")" = Z ]; then
      rm -f "$PIDFILE"
      log "stopped"
      return 0
    fi
    sleep 0.5
  done
  log "dockerd $pid did not exit within 60 s; killing it"
  kill -KILL "$pid" 2>/dev/null || true
  sleep 1
  rm -f "$PIDFILE"
}

status() {
  local pid
  pid=$(engine_pid)
  if [ -z "$pid" ]; then echo stopped; exit 3; fi
  if [ "$(proc_state "$pid")" = T ]; then echo "paused (pid $pid)"; return 0; fi
  if answers; then echo "running (pid $pid, $HOST)"; else echo "not answering (pid $pid)"; fi
}

teardown() {
  local pid ids
  pid=$(engine_pid)
  if [ -z "$pid" ]; then
    log "not running; nothing to tear down"
    return 0
  fi
  [ "$(proc_state "$pid")" = T ] && kill -CONT "$pid" 2>/dev/null || true
  if answers; then
    ids=$(dk ps -aq || true)
    if [ -n "$ids" ]; then
      log "removing $(echo "$ids" | wc -l) container(s)"
      # shellcheck disable=SC2086
      dk rm -f -v $ids >/dev/null || true
    fi
  fi
  stop
}
