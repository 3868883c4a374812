#!/usr/bin/env bash
# A second, isolated Docker engine for the fault-tolerance suite (__test__/faults/). The suite
# stops, restarts and freezes (SIGSTOP) an engine; doing that to the main one would break
# everyone else using it, so the faults are injected here instead.
#
# The fault engine shares nothing mutable with the main daemon: its own socket, data root, exec
# root (and so its own managed containerd, runc state and netns), pid file and cgroup parent.
# It runs in its own network namespace (unshare --net) with no bridge and no iptables
# (--bridge=none --iptables=false --ip-masq=false): with --bridge=none on the host's namespace,
# dockerd would delete the main engine's docker0. Sandboxes on it use `network: 'none'`.
#
#   scripts/fault-engine.sh start      start it (idempotent), wait until it answers, load the image
#   scripts/fault-engine.sh stop       SIGTERM, wait for it (and its containerd) to exit
#   scripts/fault-engine.sh restart    stop, then start
#   scripts/fault-engine.sh pause      SIGSTOP the dockerd process (the engine hangs)
#   scripts/fault-engine.sh resume     SIGCONT it
#   scripts/fault-engine.sh status     running / paused / stopped (exit 0 / 0 / 3)
#   scripts/fault-engine.sh teardown   remove every container on it, then stop it
#   scripts/fault-engine.sh host       print its address (unix:///var/run/docker-faults.sock)
#
# It never signals, stops or reconfigures the main engine: every signal goes to the pid in this
# engine's own pid file, checked to be a dockerd using this engine's socket first.
set -euo pipefail

SOCK=/var/run/docker-faults.sock
HOST="unix://$SOCK"
DATA_ROOT=/var/lib/docker-faults
EXEC_ROOT=/var/run/docker-faults
PIDFILE=/var/run/docker-faults.pid
LOG=/tmp/dockerd-faults.log
CONFIG=/var/run/docker-faults.json
IMAGES=(trueforge-sandbox-busybox:1)

log() { printf '[fault-engine] %s\n' "$*" >&2; }
dk() { docker -H "$HOST" "$@"; }

# The fault dockerd's pid, or nothing: the pid file must name a live dockerd whose command line
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
      log "image $img is not in the main engine either: run scripts/ensure-images.sh first"
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
    if ! command -v dockerd >/dev/null 2>&1; then
      log "no dockerd: run scripts/ensure-engine.sh first"; exit 1
    fi
    mkdir -p "$DATA_ROOT" "$EXEC_ROOT"
    # An empty config file: options from /etc/docker/daemon.json (hosts, bridge …) meant for
    # the main engine must not leak into this one.
    echo '{}' > "$CONFIG"
    # A stale socket from a killed daemon would make dockerd refuse to start.
    [ -S "$SOCK" ] && rm -f "$SOCK"
    log "starting dockerd on $HOST (log: $LOG)"
    setsid unshare --net dockerd \
      --config-file "$CONFIG" \
      --host "$HOST" \
      --data-root "$DATA_ROOT" \
      --exec-root "$EXEC_ROOT" \
      --pidfile "$PIDFILE" \
      --cgroup-parent /docker-faults \
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
  log "the fault engine did not answer within 60 s; its log ends with:"
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

pause() {
  local pid
  pid=$(engine_pid)
  [ -n "$pid" ] || { log "not running"; exit 1; }
  kill -STOP "$pid"
  log "dockerd $pid paused (SIGSTOP)"
}

resume() {
  local pid
  pid=$(engine_pid)
  [ -n "$pid" ] || { log "not running"; exit 1; }
  kill -CONT "$pid"
  log "dockerd $pid resumed (SIGCONT)"
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

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  restart) stop; start ;;
  pause) pause ;;
  resume) resume ;;
  status) status ;;
  teardown) teardown ;;
  host) echo "$HOST" ;;
  *)
    echo "usage: $0 start|stop|restart|pause|resume|status|teardown|host" >&2
    exit 2
    ;;
esac
