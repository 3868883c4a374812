#!/usr/bin/env bash
# A second, isolated Docker engine for tests whose commands act on every namespace or on the
# whole engine (`rm --stopped --all-namespaces`, `rm --image-work`, the reaper's engine-wide
# sweeps timed over minutes): on the main engine, shared with every other test run, they would
# remove other runs' stopped sandboxes and leases. Only __test__/ownership.test.ts uses it.
#
# Like scripts/engines/fault-engine.sh, it shares nothing mutable with other engines
# (scripts/lib/test-dockerd.sh); it has no network (sandboxes on it use `network: 'none'`).
#
#   scripts/engines/scratch-engine.sh start      start it (idempotent), wait until it answers, load the image
#   scripts/engines/scratch-engine.sh stop       SIGTERM, wait for it to exit
#   scripts/engines/scratch-engine.sh teardown   remove every container on it, then stop it
#   scripts/engines/scratch-engine.sh status     running / stopped (exit 0 / 3)
#   scripts/engines/scratch-engine.sh host       print its address
set -euo pipefail

ENGINE_NAME=scratch
ENGINE_WHAT="scratch test engine"
# shellcheck source=../lib/test-dockerd.sh
. "$(dirname "$0")/../lib/test-dockerd.sh"

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  teardown) teardown ;;
  status) status ;;
  host) echo "$HOST" ;;
  *) echo "usage: $0 start|stop|teardown|status|host" >&2; exit 2 ;;
esac
