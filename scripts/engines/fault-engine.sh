#!/usr/bin/env bash
# A second, isolated Docker engine for the fault-tolerance suite (__test__/faults/). The suite
# stops, restarts and freezes (SIGSTOP) an engine; doing that to the main one would break
# everyone else using it, so the faults are injected here instead.
#
# The fault engine shares nothing mutable with the main daemon (scripts/lib/test-dockerd.sh).
#
#   scripts/engines/fault-engine.sh start      start it (idempotent), wait until it answers, load the image
#   scripts/engines/fault-engine.sh stop       SIGTERM, wait for it (and its containerd) to exit
#   scripts/engines/fault-engine.sh restart    stop, then start
#   scripts/engines/fault-engine.sh pause      SIGSTOP the dockerd process (the engine hangs)
#   scripts/engines/fault-engine.sh resume     SIGCONT it
#   scripts/engines/fault-engine.sh status     running / paused / stopped (exit 0 / 0 / 3)
#   scripts/engines/fault-engine.sh teardown   remove every container on it, then stop it
#   scripts/engines/fault-engine.sh host       print its address (unix:///var/run/docker-faults.sock)
set -euo pipefail

ENGINE_NAME=faults
ENGINE_LOG_TAG=fault
ENGINE_WHAT="fault engine"
# shellcheck source=../lib/test-dockerd.sh
. "$(dirname "$0")/../lib/test-dockerd.sh"

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
