#!/usr/bin/env bash
# A second, isolated Docker engine with gVisor's runsc registered as the runtime `runsc`, for the
# suites run with `runtime: 'runsc'` (jest --selectProjects runsc) and bench/runsc.js. runsc comes
# from Debian's package (release 20221219 on Debian 12: ptrace platform, no systrap, no KVM here).
#
# The runtime is registered through this engine's own config file, never the main engine's. Like
# the other test engines (scripts/lib/test-dockerd.sh) it runs in a network namespace with no
# interfaces, where runsc refuses to start a sandbox with its own network stack ("cannot run with
# network enabled in root network namespace"): `--network=none` gives each sandbox loopback only,
# which is all the suites use. `runsc-debug` is the same runtime logging every system call the
# sandbox makes, with its errors, under /tmp/runsc-gvisor/ (for finding what gVisor refuses).
#
#   scripts/engines/gvisor-engine.sh start      install runsc if missing, start (idempotent), load images,
#                                       check that a container runs under runsc
#   scripts/engines/gvisor-engine.sh stop       SIGTERM, wait for it to exit
#   scripts/engines/gvisor-engine.sh teardown   remove every container on it, then stop it
#   scripts/engines/gvisor-engine.sh status     running / stopped (exit 0 / 3)
#   scripts/engines/gvisor-engine.sh host       print its address (unix:///var/run/docker-gvisor.sock)
set -euo pipefail

RUNSC=/usr/bin/runsc
DEBUG_LOG=/tmp/runsc-gvisor/
ENGINE_NAME=gvisor
ENGINE_WHAT="gVisor test engine"
ENGINE_STARTING_NOTE="with runsc registered"
ENGINE_CONFIG_JSON=$(cat <<JSON
{"runtimes": {
  "runsc": {"path": "$RUNSC", "runtimeArgs": ["--network=none", "--platform=ptrace"]},
  "runsc-debug": {"path": "$RUNSC", "runtimeArgs": ["--network=none", "--platform=ptrace",
    "--debug", "--strace", "--debug-log=$DEBUG_LOG"]}
}}
JSON
)
# shellcheck source=../lib/test-dockerd.sh
. "$(dirname "$0")/../lib/test-dockerd.sh"
# busybox for most suites, Debian for bash and coreutils, the TrueForge image for Code Mode and
# Python.
IMAGES=(trueforge-sandbox-busybox:1 trueforge-sandbox-debian:12 trueforge-sandbox:2)

install() {
  [ -x "$RUNSC" ] && return 0
  log "installing runsc (Debian package)"
  export DEBIAN_FRONTEND=noninteractive
  if ! apt-get install -y -qq runsc >/dev/null 2>&1; then
    apt-get update -qq
    apt-get install -y -qq runsc >/dev/null
  fi
}

before_start() { mkdir -p "$DEBUG_LOG"; }

# A tiny container under runsc: the runtime is registered and starts sandboxes here.
check() {
  local out
  if ! out=$(dk run --rm --runtime runsc --network none trueforge-sandbox-busybox:1 sh -c 'dmesg | head -n 1' 2>&1); then
    log "a container did not run under runsc: $out"
    return 1
  fi
  case "$out" in
    *gVisor*) log "runsc runs containers ($out)" ;;
    *) log "the container ran, but not under gVisor: $out"; return 1 ;;
  esac
}

case "${1:-}" in
  start) install; start; check ;;
  stop) stop ;;
  teardown) teardown ;;
  status) status ;;
  host) echo "$HOST" ;;
  *) echo "usage: $0 start|stop|teardown|status|host" >&2; exit 2 ;;
esac
