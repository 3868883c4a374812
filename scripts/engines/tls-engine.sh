#!/usr/bin/env bash
# A second Docker engine that only speaks TLS on TCP, for the engine-connection tests
# (__test__/engines.test.ts): `dockerd --tlsverify` with certificates made here by openssl.
#
# Like the fault engine it shares nothing mutable with the main daemon (own socket, data root,
# exec root, pid file, cgroup parent) and runs in its own network namespace (unshare --net, no
# bridge, no iptables: with --bridge=none in the host's namespace dockerd would delete docker0).
# Its TLS port 127.0.0.1:2376 inside that namespace is forwarded to 127.0.0.1:$TLS_PORT on the
# host by two copies of scripts/engines/netns-forward.js through a unix socket.
#
#   scripts/engines/tls-engine.sh start      make fresh certificates, start it, wait, load the image;
#                                    prints KEY=VALUE lines (TLS_HOST, CERTS, SOCKET)
#   scripts/engines/tls-engine.sh teardown   remove every container on it, stop it and the forwarders
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
NAME=docker-tls
SOCK=/var/run/$NAME.sock
FWD_SOCK=/var/run/$NAME.fwd.sock
DATA_ROOT=/var/lib/$NAME
EXEC_ROOT=/var/run/$NAME
PIDFILE=/var/run/$NAME.pid
FWD_PIDS=/var/run/$NAME.forwarders
CERTS=/var/run/$NAME-certs
CONFIG=/var/run/$NAME.json
LOG=/tmp/dockerd-tls.log
TLS_PORT=${TLS_PORT:-23761}
IMAGES=(trueforge-sandbox-busybox:1)

log() { printf '[tls-engine] %s\n' "$*" >&2; }
dk() { docker -H "unix://$SOCK" "$@"; }

engine_pid() {
  [ -f "$PIDFILE" ] || return 0
  local pid
  pid=$(tr -dc '0-9' < "$PIDFILE" 2>/dev/null || true)
  [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] || return 0
  if tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -q -- "$SOCK"; then echo "$pid"; fi
}

answers() { timeout 5 docker -H "unix://$SOCK" info >/dev/null 2>&1; }

# ca.pem/cert.pem/key.pem (the good client set), server-*.pem, and beside them in subfolders:
# other-ca/ (a CA the engine never saw, with a client pair it signed), expired/ (a client pair
# from the right CA that expired at issue), no-client/ (the CA alone).
make_certs() {
  rm -rf "$CERTS"
  mkdir -p "$CERTS" && chmod 700 "$CERTS"
  cd "$CERTS"
  local ec=(-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes)
  openssl req -x509 "${ec[@]}" -keyout ca-key.pem -out ca.pem -days 2 -subj /CN=tf-test-ca 2>/dev/null
  openssl req "${ec[@]}" -keyout server-key.pem -out server.csr -subj /CN=localhost 2>/dev/null
  printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n' > server.ext
  openssl x509 -req -in server.csr -CA ca.pem -CAkey ca-key.pem -CAcreateserial -days 2 \
    -out server-cert.pem -extfile server.ext 2>/dev/null
  printf 'extendedKeyUsage=clientAuth\n' > client.ext
  openssl req "${ec[@]}" -keyout key.pem -out client.csr -subj /CN=tf-client 2>/dev/null
  openssl x509 -req -in client.csr -CA ca.pem -CAkey ca-key.pem -CAcreateserial -days 2 \
    -out cert.pem -extfile client.ext 2>/dev/null
  mkdir -p expired other-ca no-client
  cp ca.pem expired/ && cp ca.pem no-client/
  openssl req "${ec[@]}" -keyout expired/key.pem -out expired.csr -subj /CN=tf-expired 2>/dev/null
  openssl x509 -req -in expired.csr -CA ca.pem -CAkey ca-key.pem -CAcreateserial -days 0 \
    -out expired/cert.pem -extfile client.ext 2>/dev/null
  openssl req -x509 "${ec[@]}" -keyout other-ca/ca-key.pem -out other-ca/ca.pem -days 2 -subj /CN=tf-other-ca 2>/dev/null
  openssl req "${ec[@]}" -keyout other-ca/key.pem -out other.csr -subj /CN=tf-other 2>/dev/null
  openssl x509 -req -in other.csr -CA other-ca/ca.pem -CAkey other-ca/ca-key.pem -CAcreateserial \
    -days 2 -out other-ca/cert.pem -extfile client.ext 2>/dev/null
  rm -f ./*.csr ./*.ext ./*.srl other-ca/*.srl
  cd - >/dev/null
}

stop_forwarders() {
  if [ -f "$FWD_PIDS" ]; then
    local pid
    for pid in $(cat "$FWD_PIDS"); do
      if tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -q netns-forward; then kill "$pid" 2>/dev/null || true; fi
    done
    rm -f "$FWD_PIDS"
  fi
}

start() {
  command -v dockerd >/dev/null || { log "no dockerd: run scripts/engines/ensure-engine.sh first"; exit 1; }
  local pid
  pid=$(engine_pid)
  if [ -z "$pid" ]; then
    make_certs
    mkdir -p "$DATA_ROOT" "$EXEC_ROOT"
    echo '{}' > "$CONFIG"
    rm -f "$SOCK"
    log "starting dockerd --tlsverify (log: $LOG)"
    setsid unshare --net sh -c '
      ip link set lo up
      exec dockerd --config-file "$0" --host "unix://$1" --host tcp://127.0.0.1:2376 \
        --tlsverify --tlscacert "$2/ca.pem" --tlscert "$2/server-cert.pem" --tlskey "$2/server-key.pem" \
        --data-root "$3" --exec-root "$4" --pidfile "$5" --cgroup-parent /docker-tls \
        --bridge=none --iptables=false --ip-masq=false --ip-forward=false' \
      "$CONFIG" "$SOCK" "$CERTS" "$DATA_ROOT" "$EXEC_ROOT" "$PIDFILE" >>"$LOG" 2>&1 </dev/null &
  fi
  for _ in $(seq 1 120); do
    answers && break
    sleep 0.5
  done
  answers || { log "the TLS engine did not answer within 60 s"; tail -n 30 "$LOG" >&2; exit 1; }
  pid=$(engine_pid)
  stop_forwarders
  setsid nsenter --net="/proc/$pid/ns/net" node "$ROOT/scripts/engines/netns-forward.js" "unix:$FWD_SOCK" tcp:127.0.0.1:2376 \
    >>"$LOG" 2>&1 </dev/null &
  echo $! > "$FWD_PIDS"
  setsid node "$ROOT/scripts/engines/netns-forward.js" "tcp:127.0.0.1:$TLS_PORT" "unix:$FWD_SOCK" >>"$LOG" 2>&1 </dev/null &
  echo $! >> "$FWD_PIDS"
  local img
  for img in "${IMAGES[@]}"; do
    dk image inspect "$img" >/dev/null 2>&1 || docker save "$img" | dk load >/dev/null
  done
  for _ in $(seq 1 40); do
    timeout 5 docker -H "tcp://127.0.0.1:$TLS_PORT" --tlsverify --tlscacert "$CERTS/ca.pem" \
      --tlscert "$CERTS/cert.pem" --tlskey "$CERTS/key.pem" version >/dev/null 2>&1 && break
    sleep 0.25
  done
  log "engine up: tcp://127.0.0.1:$TLS_PORT (TLS), unix://$SOCK"
  echo "TLS_HOST=tcp://127.0.0.1:$TLS_PORT"
  echo "CERTS=$CERTS"
  echo "SOCKET=unix://$SOCK"
}

teardown() {
  stop_forwarders
  local pid ids
  pid=$(engine_pid)
  if [ -z "$pid" ]; then log "not running"; return 0; fi
  if answers; then
    ids=$(dk ps -aq || true)
    # shellcheck disable=SC2086
    [ -z "$ids" ] || dk rm -f -v $ids >/dev/null || true
  fi
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 120); do
    [ -d "/proc/$pid" ] || break
    sleep 0.5
  done
  [ ! -d "/proc/$pid" ] || kill -KILL "$pid" 2>/dev/null || true
  rm -f "$PIDFILE" "$FWD_SOCK"
  rm -rf "$CERTS"
  log "stopped"
}

case "${1:-}" in
  start) start ;;
  teardown) teardown ;;
  *) echo "usage: $0 start|teardown" >&2; exit 2 ;;
esac
