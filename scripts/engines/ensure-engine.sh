#!/usr/bin/env bash
# Makes sure a Docker engine answers on the local socket: installs Debian's engine when
# there is none and starts dockerd in the background. Safe to run again.
set -euo pipefail

log() { printf '[engine] %s\n' "$*" >&2; }

if docker info >/dev/null 2>&1; then
  log "engine already running ($(docker version --format '{{.Server.Version}}' 2>/dev/null))"
  exit 0
fi

if ! command -v dockerd >/dev/null 2>&1; then
  if [ "$(id -u)" -ne 0 ]; then
    log "no dockerd and not root: install Docker, then run this again"; exit 1
  fi
  log "installing Debian's docker.io"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq docker.io >/dev/null
fi

log "starting dockerd (log: /tmp/dockerd.log, appended)"
setsid dockerd >>/tmp/dockerd.log 2>&1 < /dev/null &
for _ in $(seq 1 60); do
  if docker info >/dev/null 2>&1; then
    log "engine up ($(docker version --format '{{.Server.Version}}' 2>/dev/null))"
    exit 0
  fi
  sleep 0.5
done
log "dockerd did not answer within 30 s; its log ends with:"
tail -n 20 /tmp/dockerd.log >&2 || true
exit 1
