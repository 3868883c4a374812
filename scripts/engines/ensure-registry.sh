#!/usr/bin/env bash
# Runs local container registries on loopback for the image tests (no registry on the internet
# is reachable here). Uses Debian's `docker-registry` (github.com/docker/distribution 2.8),
# installed when missing. Safe to run again, and from several test processes at once: a
# registry that already answers is reused.
#
#   127.0.0.1:5000  plain HTTP, no auth                    (always)
#   127.0.0.1:5001  plain HTTP, htpasswd basic auth        (unless `plain` is passed)
#                   user TF_REGISTRY_USER / TF_REGISTRY_PASSWORD below
#
# dockerd allows plain-HTTP ("insecure") registries on 127.0.0.0/8 by default; this script
# checks `docker info` and warns when that is not so.
#
# Each registry has its own config, storage and log under $TF_REGISTRY_ROOT
# (default /var/lib/trueforge-registry when writable, else /tmp/trueforge-registry):
#   <root>/plain/{config.yml,data/,registry.log}   <root>/auth/{config.yml,htpasswd,data/,registry.log}
# registry.log holds the access log (Combined Log Format, one line per request), so a test can
# count the manifest requests a pull made.
#
# Usage: scripts/engines/ensure-registry.sh [all|plain|stop]
#   all (default)  both registries      plain  only :5000
#   stop           stops the registries this script started (by their pid files)
# Prints KEY=VALUE lines on stdout (PLAIN_REGISTRY, AUTH_REGISTRY, AUTH_USER, AUTH_PASSWORD,
# PLAIN_LOG, AUTH_LOG) for callers; progress goes to stderr.
set -euo pipefail

# Fixed credentials of the auth registry (test-only; it listens on loopback alone).
TF_REGISTRY_USER=${TF_REGISTRY_USER:-tf-tester}
TF_REGISTRY_PASSWORD=${TF_REGISTRY_PASSWORD:-tf-registry-secret-1}
PLAIN_ADDR=127.0.0.1:5000
AUTH_ADDR=127.0.0.1:5001
want=${1:-all}

log() { printf '[registry] %s\n' "$*" >&2; }

if [ -z "${TF_REGISTRY_ROOT:-}" ]; then
  if mkdir -p /var/lib/trueforge-registry 2>/dev/null && [ -w /var/lib/trueforge-registry ]; then
    TF_REGISTRY_ROOT=/var/lib/trueforge-registry
  else
    TF_REGISTRY_ROOT=/tmp/trueforge-registry
  fi
fi
mkdir -p "$TF_REGISTRY_ROOT"

# One caller at a time sets things up; the others wait here and then find the registries up.
exec 9>"$TF_REGISTRY_ROOT/.lock"
if command -v flock >/dev/null 2>&1; then flock -w 120 9; fi

apt_ready=0
apt_install() {
  if [ "$(id -u)" -ne 0 ]; then log "$* missing and not root: install it, then run this again"; exit 1; fi
  export DEBIAN_FRONTEND=noninteractive
  if [ "$apt_ready" = 0 ]; then apt-get update -qq; apt_ready=1; fi
  apt-get install -y -qq "$@" >/dev/null
}

# HTTP status of GET /v2/ (000 when nothing answers).
v2_code() { curl -s -o /dev/null -m 3 -w '%{http_code}' "http://$1/v2/" 2>/dev/null || true; }

stop_one() {
  local dir=$1 pid
  [ -f "$dir/registry.pid" ] || return 0
  pid=$(cat "$dir/registry.pid")
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null \
     && tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -q "docker-registry serve $dir/config.yml"; then
    kill "$pid" && log "stopped registry pid $pid ($dir)"
  fi
  rm -f "$dir/registry.pid"
}

if [ "$want" = stop ]; then
  stop_one "$TF_REGISTRY_ROOT/plain"
  stop_one "$TF_REGISTRY_ROOT/auth"
  exit 0
fi
case "$want" in all|plain) ;; *) log "unknown argument '$want' (all, plain or stop)"; exit 2 ;; esac

command -v docker-registry >/dev/null 2>&1 || apt_install docker-registry
command -v curl >/dev/null 2>&1 || apt_install curl

if docker info --format '{{json .RegistryConfig.InsecureRegistryCIDRs}}' 2>/dev/null | grep -q '127.0.0.0/8'; then
  :
else
  log "warning: dockerd does not list 127.0.0.0/8 as an insecure registry range; plain-HTTP pulls from loopback may fail"
fi

# write_config DIR ADDR [htpasswd-file]
write_config() {
  local dir=$1 addr=$2 htpasswd=${3:-}
  mkdir -p "$dir/data"
  {
    cat <<EOF
# Written by scripts/engines/ensure-registry.sh: a test registry on loopback, plain HTTP.
version: 0.1
log:
  level: info
  formatter: text
  fields:
    service: trueforge-test-registry
storage:
  cache:
    blobdescriptor: inmemory
  filesystem:
    rootdirectory: $dir/data
  delete:
    enabled: true
http:
  addr: $addr
  headers:
    X-Content-Type-Options: [nosniff]
EOF
    if [ -n "$htpasswd" ]; then
      cat <<EOF
auth:
  htpasswd:
    realm: trueforge-test-realm
    path: $htpasswd
EOF
    fi
  } > "$dir/config.yml.new"
  mv "$dir/config.yml.new" "$dir/config.yml"
}

# start_registry DIR ADDR EXPECTED_CODE
start_registry() {
  local dir=$1 addr=$2 expect=$3 code
  code=$(v2_code "$addr")
  if [ "$code" = "$expect" ]; then log "registry on $addr already answering ($code)"; return 0; fi
  if [ "$code" != 000 ]; then
    log "something else answers on $addr (HTTP $code, expected $expect); not starting another"
    exit 1
  fi
  stop_one "$dir"
  log "starting registry on $addr (config $dir/config.yml, log $dir/registry.log)"
  # Fully detached: no inherited pipes (callers such as execFileSync wait for them) and not
  # the lock fd (later callers would wait for it forever).
  setsid docker-registry serve "$dir/config.yml" >>"$dir/registry.log" 2>&1 </dev/null 9>&- &
  echo $! > "$dir/registry.pid"
  for _ in $(seq 1 60); do
    code=$(v2_code "$addr")
    if [ "$code" = "$expect" ]; then log "registry on $addr up"; return 0; fi
    sleep 0.25
  done
  log "registry on $addr did not answer within 15 s (last HTTP $code); its log ends with:"
  tail -n 20 "$dir/registry.log" >&2 || true
  exit 1
}

make_htpasswd() {
  local file=$1
  if [ -s "$file" ] && command -v htpasswd >/dev/null 2>&1 \
     && htpasswd -vb "$file" "$TF_REGISTRY_USER" "$TF_REGISTRY_PASSWORD" >/dev/null 2>&1; then
    return 0
  fi
  command -v htpasswd >/dev/null 2>&1 || apt_install apache2-utils
  mkdir -p "$(dirname "$file")"
  # The registry only accepts bcrypt entries.
  htpasswd -B -b -c "$file.new" "$TF_REGISTRY_USER" "$TF_REGISTRY_PASSWORD"
  mv "$file.new" "$file"
}

plain_dir=$TF_REGISTRY_ROOT/plain
auth_dir=$TF_REGISTRY_ROOT/auth

if [ "$(v2_code "$PLAIN_ADDR")" != 200 ]; then write_config "$plain_dir" "$PLAIN_ADDR"; fi
start_registry "$plain_dir" "$PLAIN_ADDR" 200

if [ "$want" = all ]; then
  if [ "$(v2_code "$AUTH_ADDR")" != 401 ]; then
    make_htpasswd "$auth_dir/htpasswd"
    write_config "$auth_dir" "$AUTH_ADDR" "$auth_dir/htpasswd"
  fi
  start_registry "$auth_dir" "$AUTH_ADDR" 401
  code=$(curl -s -o /dev/null -m 3 -w '%{http_code}' -u "$TF_REGISTRY_USER:$TF_REGISTRY_PASSWORD" "http://$AUTH_ADDR/v2/" || true)
  if [ "$code" != 200 ]; then
    log "the auth registry on $AUTH_ADDR refuses the script's credentials (HTTP $code)"
    exit 1
  fi
fi

echo "PLAIN_REGISTRY=$PLAIN_ADDR"
echo "PLAIN_LOG=$plain_dir/registry.log"
if [ "$want" = all ]; then
  echo "AUTH_REGISTRY=$AUTH_ADDR"
  echo "AUTH_USER=$TF_REGISTRY_USER"
  echo "AUTH_PASSWORD=$TF_REGISTRY_PASSWORD"
  echo "AUTH_LOG=$auth_dir/registry.log"
fi
