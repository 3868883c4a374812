#!/usr/bin/env bash
# A rootless Podman serving the Docker-compatible API, for the rootless run of the Podman suites
# (jest --selectProjects podman). It runs as its own unprivileged user (`tf-rootless`, created here with
# a subordinate id range), with that user's storage and runtime directory, as
# `systemctl --user enable --now podman.socket` would run it on a desktop. The tests, running as
# root, reach its socket like a server that was given access to it.
#
#   scripts/engines/podman-rootless-engine.sh start      create the user if missing, start, load images
#   scripts/engines/podman-rootless-engine.sh teardown   remove every container on it, stop it
#   scripts/engines/podman-rootless-engine.sh host       print its address
set -euo pipefail

USER_NAME=tf-rootless
LOG=/tmp/tf-podman-rootless.log
IMAGES=(trueforge-sandbox-busybox:1 trueforge-sandbox-debian:12 trueforge-sandbox:2)

log() { printf '[podman-rootless] %s\n' "$*" >&2; }
# shellcheck source=../lib/podman-service.sh
. "$(dirname "$0")/../lib/podman-service.sh"

uid_of() { id -u "$USER_NAME" 2>/dev/null || true; }
runtime_dir() { echo "/run/user/$(uid_of)"; }
sock() { echo "$(runtime_dir)/podman/podman.sock"; }
host() { echo "unix://$(sock)"; }

service_pid() {
  local p
  for p in /proc/[0-9]*; do
    if [ "$(stat -c %U "$p" 2>/dev/null)" = "$USER_NAME" ] &&
      tr '\0' ' ' 2>/dev/null < "$p/cmdline" | grep -q "^podman system service"; then
      echo "${p#/proc/}"
      return 0
    fi
  done
}

start() {
  bash "$(dirname "$0")/podman-engine.sh" install
  if [ -z "$(uid_of)" ]; then
    log "creating user $USER_NAME"
    useradd --create-home --shell /usr/sbin/nologin "$USER_NAME"
  fi
  # Rootless containers need a range of subordinate ids (newuidmap/newgidmap, from uidmap).
  grep -q "^$USER_NAME:" /etc/subuid || echo "$USER_NAME:200000:65536" >> /etc/subuid
  grep -q "^$USER_NAME:" /etc/subgid || echo "$USER_NAME:200000:65536" >> /etc/subgid
  # slirp4netns (the rootless network) opens /dev/net/tun as the user: 0666 is its usual mode,
  # this VM ships it 0600.
  [ "$(stat -c %a /dev/net/tun)" = 666 ] || chmod 0666 /dev/net/tun
  local rd conf
  rd=$(runtime_dir)
  install -d -m 0700 -o "$USER_NAME" -g "$USER_NAME" "$rd" "$rd/podman"
  conf="/home/$USER_NAME/.config/containers"
  install -d -o "$USER_NAME" -g "$USER_NAME" "/home/$USER_NAME/.config" "$conf"
  # Overlay is the kernel's rootless overlay (no fuse-overlayfs needed on this kernel).
  write_containers_conf "$conf/containers.conf"
  printf '[storage]\ndriver = "overlay"\n' > "$conf/storage.conf"
  chown "$USER_NAME:" "$conf/containers.conf" "$conf/storage.conf"
  if [ -z "$(service_pid)" ]; then
    rm -f "$(sock)"
    # A subshell that execs, all of its descriptors redirected: nothing keeps the caller's pipes.
    (cd / && exec setsid runuser -u "$USER_NAME" -- env HOME="/home/$USER_NAME" XDG_RUNTIME_DIR="$rd" \
      podman system service --time=0 "$(host)") >>"$LOG" 2>&1 </dev/null &
  fi
  await_service "$(host)" "rootless podman" "$LOG"
  log "rootless podman up on $(host)"
  host
}

teardown() {
  local pid
  pid=$(service_pid)
  [ -n "$pid" ] || { log "not running"; return 0; }
  stop_service "$(host)" "$pid"
  rm -f "$(sock)"
  # The user's lingering conmons (one per exec, up to 300 s) and its slirp4netns/pause process.
  pkill -TERM -u "$USER_NAME" 2>/dev/null || true
  log "stopped"
}

case "${1:-}" in
  start) start ;;
  teardown) teardown ;;
  host) host ;;
  *) echo "usage: $0 start|teardown|host" >&2; exit 2 ;;
esac
