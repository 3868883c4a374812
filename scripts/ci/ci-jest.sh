#!/usr/bin/env bash
# The jest step of .ci/run, on the main engine, with a watchdog for one engine bug.
#
# Docker before 20.10.27 (Debian 12's docker.io is 20.10.24) can deadlock in libnetwork (moby
# issue 46661): a container leaving a network while another joins or leaves the same network
# can take the network's and the controller's locks in opposite orders, on the default bridge
# as on any other. From then on no container starts, `network ls` never answers, and every
# later test waits out its timeout (one CI run here spent its whole budget that way).
#
# So a watchdog probes the engine. If it has not answered `network ls` twice in a row, the
# watchdog asks dockerd for its goroutines. Only when some are parked for minutes on a lock in
# libnetwork does it restart the engine (the stuck goroutines are printed) and let the run go on;
# the test files that failed are then run once more, and only once. Any other hang that lasts
# five minutes stops the run with the blocked goroutines, and the step fails.
#
# Usage: scripts/ci/ci-jest.sh [jest arguments…] (for the first run; the second names only files)
set -euo pipefail
cd "$(dirname "$0")/../.."

WORK=$(mktemp -d /tmp/ci-jest.XXXXXX)
RESULTS=$WORK/results.json
RESTARTS=$WORK/restarts
PROBE_EVERY=${PROBE_EVERY:-15}
PROBE_TIMEOUT=${PROBE_TIMEOUT:-40}
HANG_LIMIT=${HANG_LIMIT:-300}

log() { printf '[ci-jest] %s\n' "$*" >&2; }

# dockerd writes its goroutines to a file on SIGUSR1 and logs the file's path.
goroutine_dump() {
  local pid=$1 before
  before=$(grep -c 'goroutine stacks written to' /tmp/dockerd.log 2>/dev/null || true)
  kill -USR1 "$pid" 2>/dev/null || return 1
  for _ in $(seq 1 20); do
    sleep 0.5
    local now
    now=$(grep -c 'goroutine stacks written to' /tmp/dockerd.log 2>/dev/null || true)
    if [ "${now:-0}" -gt "${before:-0}" ]; then
      grep -o 'goroutine stacks written to [^"]*' /tmp/dockerd.log | tail -n 1 | sed 's/goroutine stacks written to //'
      return 0
    fi
  done
  return 1
}

# Goroutines parked for minutes on a lock inside libnetwork: the deadlock (46661 and its kin,
# all lock-order bugs fixed in later engines), printed as the evidence.
libnetwork_stuck() {
  awk '
    /^goroutine [0-9]+ \[/ { if (keep) printf "%s", block; block = ""; keep = 0
      stuck = ($0 ~ /\[(semacquire|sync\.(RW)?Mutex\.R?Lock), [0-9]+ minutes\]/) }
    { block = block $0 "\n" }
    stuck && /libnetwork/ { keep = 1 }
    END { if (keep) printf "%s", block }
  ' "$1"
}

restart_engine() {
  local pid=$1
  kill -KILL "$pid" 2>/dev/null || true
  for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
  bash scripts/engines/ensure-engine.sh
  # The new engine stops the containers it finds running; a container that was being started
  # when the old one died is nobody's, and its shim would stay. Only the main engine's shims.
  sleep 5
  local running shim id
  running=$(timeout 60 docker ps -q --no-trunc 2>/dev/null || true)
  for shim in $(pgrep -f '^/usr/bin/containerd-shim-runc-v2 -namespace moby -id [0-9a-f]+ -address /var/run/docker/containerd/containerd.sock' || true); do
    id=$(tr '\0' ' ' < "/proc/$shim/cmdline" 2>/dev/null | sed -n 's/.* -id \([0-9a-f]*\) .*/\1/p')
    [ -n "$id" ] && ! grep -qx "$id" <<<"$running" || continue
    log "removing the shim of container ${id:0:12}, which the restarted engine does not know"
    pkill -KILL -P "$shim" 2>/dev/null || true
    kill -KILL "$shim" 2>/dev/null || true
  done
}

watchdog() {
  local jest_pid=$1 misses=0 nap= hung_since=
  # Stopped between probes: the nap ends with the watchdog.
  trap 'kill $nap 2>/dev/null; exit 0' TERM
  while kill -0 "$jest_pid" 2>/dev/null; do
    sleep "$PROBE_EVERY" &
    nap=$!
    wait "$nap" || true
    if timeout "$PROBE_TIMEOUT" docker network ls -q >/dev/null 2>&1; then
      misses=0
      hung_since=
      continue
    fi
    misses=$((misses + 1))
    [ "$misses" -ge 2 ] || continue
    misses=0
    local pid dump
    pid=$(tr -dc '0-9' < /run/docker.pid 2>/dev/null || true)
    [ -n "$pid" ] || continue
    log "the engine has not answered 'network ls' for $((2 * (PROBE_EVERY + PROBE_TIMEOUT))) s; asking dockerd $pid for its goroutines"
    if dump=$(goroutine_dump "$pid") && [ -f "$dump" ]; then
      cp "$dump" "$WORK/" || true
      local stuck
      stuck=$(libnetwork_stuck "$dump")
      if [ -n "$stuck" ]; then
        log "dockerd is deadlocked in libnetwork (moby issue 46661; dump: $dump). Goroutines stuck on its locks:"
        printf '%s\n' "$stuck" | grep -E '^goroutine|libnetwork' | head -n 40 >&2
        log "restarting the engine; the test files that fail now are run again at the end"
        echo "$(date +%T) $dump" >> "$RESTARTS"
        restart_engine "$pid"
        hung_since=
        continue
      fi
    fi
    # Not (yet) that deadlock: goroutines show how long they waited only after a minute, and a
    # loaded engine may just be slow. A hang that lasts is ours to fail on.
    [ -n "$hung_since" ] || hung_since=$SECONDS
    if [ $((SECONDS - hung_since)) -lt "$HANG_LIMIT" ]; then
      log "no goroutine parked for minutes on libnetwork's locks yet: watching on"
      continue
    fi
    log "the engine has hung for over $HANG_LIMIT s, and not in the known libnetwork deadlock: stopping the run. Blocked goroutines:"
    [ -z "${dump:-}" ] || grep -A8 -E '^goroutine [0-9]+ \[(semacquire|sync\.Mutex\.Lock|sync\.RWMutex\.Lock)' "$dump" | head -n 80 >&2 || true
    kill -TERM -- "-$jest_pid" 2>/dev/null || true
    return
  done
}

# Sandboxes a failed or wedged run could not remove (their afterAll cleanup failed or timed
# out). Every test has ended by then; this engine runs no other tests meanwhile.
remove_stranded() {
  local ids
  ids=$( (timeout 60 docker ps -aq --filter label=trueforge.sandbox.namespace
    timeout 60 docker ps -aq --filter label=trueforge-test.namespace) 2>/dev/null | sort -u || true)
  # shellcheck disable=SC2086
  [ -z "$ids" ] || timeout 120 docker rm -f -v $ids >/dev/null 2>&1 || true
}

cleanup() {
  local rc=$?
  [ -z "${WATCHDOG:-}" ] || kill "$WATCHDOG" 2>/dev/null || true
  [ "$rc" -eq 0 ] || remove_stranded
  # The goroutine dumps stay for a look afterwards; without a restart there is nothing to keep.
  [ -s "$RESTARTS" ] || rm -rf "$WORK"
}
trap cleanup EXIT

# Runs jest with these arguments under the watchdog, in a process group of its own (stopping
# the run stops jest and its workers, not only npx); sets `status`.
run_jest() {
  status=0
  setsid npx jest --ci "$@" &
  JEST=$!
  watchdog "$JEST" &
  WATCHDOG=$!
  wait "$JEST" || status=$?
  kill "$WATCHDOG" 2>/dev/null || true
  wait "$WATCHDOG" 2>/dev/null || true
  WATCHDOG=
}

run_jest --json --outputFile="$RESULTS" "$@"
[ "$status" -ne 0 ] || exit 0
if [ ! -s "$RESTARTS" ]; then
  exit "$status"
fi

log "the engine was restarted $(wc -l < "$RESTARTS") time(s) for the libnetwork deadlock during this run:"
cat "$RESTARTS" >&2
failed=$(node -e '
  const r = require(process.argv[1])
  for (const t of r.testResults) if (t.status !== "passed") console.log(t.name)
' "$RESULTS" 2>/dev/null || true)
if [ -z "$failed" ]; then
  log "jest failed and named no failed file: not run again"
  exit "$status"
fi
remove_stranded
log "running the failed files again:"
printf '  %s\n' $failed >&2
# shellcheck disable=SC2086
run_jest $failed
exit "$status"
