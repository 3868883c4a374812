#!/usr/bin/env bash
# A rootful Podman serving the Docker-compatible API on its own socket, for the Podman run of the
# contract, exec, transfer and lifecycle suites (jest --selectProjects podman; the contract runs on
# trueforge-sandbox:2, loaded here too). Like the other test
# engines it shares nothing with the main one: its own storage root, run root, containers.conf
# (CONTAINERS_CONF, never /etc/containers/containers.conf) and network namespace (unshare --net:
# its bridge and firewall rules stay there).
#
#   scripts/engines/podman-engine.sh start      install podman + catatonit if missing, start, load images
#   scripts/engines/podman-engine.sh teardown   remove every container on it, stop it
#   scripts/engines/podman-engine.sh host       print its address
set -euo pipefail

RUN=/run/tf-podman
SOCK=$RUN/podman.sock
HOST="unix://$SOCK"
ROOT=/var/lib/tf-podman
PIDFILE=$RUN/service.pid
LOG=/tmp/tf-podman.log
IMAGES=(trueforge-sandbox-busybox:1 trueforge-sandbox-debian:12 trueforge-sandbox:2)

log() { printf '[podman-engine] %s\n' "$*" >&2; }
# shellcheck source=../lib/podman-service.sh
. "$(dirname "$0")/../lib/podman-service.sh"

service_pid() {
  [ -f "$PIDFILE" ] || return 0
  local pid
  pid=$(tr -dc '0-9' < "$PIDFILE")
  [ -n "$pid" ] && tr '\0' ' ' 2>/dev/null < "/proc/$pid/cmdline" | grep -q -- "$SOCK" && echo "$pid" || true
}

install() {
  if ! command -v podman >/dev/null || ! command -v catatonit >/dev/null || ! command -v newuidmap >/dev/null || ! command -v slirp4netns >/dev/null; then
    log "installing podman and catatonit (Debian packages)"
    local guard=""
    if [ ! -e /usr/sbin/policy-rc.d ]; then printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d && guard=1; fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o Dpkg::Options::=--force-confold podman catatonit uidmap slirp4netns >/dev/null
    [ -z "$guard" ] || rm -f /usr/sbin/policy-rc.d
  fi
}

start() {
  install
  mkdir -p "$RUN" "$ROOT"
  write_containers_conf "$RUN/containers.conf"
  if [ -z "$(service_pid)" ]; then
    rm -f "$SOCK"
    CONTAINERS_CONF="$RUN/containers.conf" setsid unshare --net sh -c \
      'ip link set lo up; echo $$ > "$0"; exec podman --root "$1" --runroot "$2/run" system service --time=0 "unix://$3"' \
      "$PIDFILE" "$ROOT" "$RUN" "$SOCK" >>"$LOG" 2>&1 </dev/null &
  fi
  await_service "$HOST" podman "$LOG"
  log "podman up on $HOST"
  echo "$HOST"
}

teardown() {
  local pid
  pid=$(service_pid)
  [ -n "$pid" ] || { log "not running"; return 0; }
  stop_service "$HOST" "$pid"
  rm -f "$PIDFILE" "$SOCK"
  # Podman leaves a conmon per exec for up to 300 s (its exit delay); end ours, by pid, only
  # those whose command line names this engine's storage root.
  local p
  for p in /proc/[0-9]*; do
    if tr '\0' ' ' 2>/dev/null < "$p/cmdline" | grep -q "^/usr/bin/conmon .*--exit-command-arg $ROOT "; then
      kill -TERM "${p#/proc/}" 2>/dev/null || true
    fi
  done
  log "stopped"
}

case "${1:-}" in
  install) install ;;
  start) start ;;
  teardown) teardown ;;
  host) echo "$HOST" ;;
  *) echo "usage: $0 install|start|teardown|host" >&2; exit 2 ;;
esac
