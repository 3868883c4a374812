# shellcheck shell=bash
# What the rootful and rootless test Podmans (scripts/engines/podman-engine.sh,
# scripts/engines/podman-rootless-engine.sh) do alike: their containers.conf, waiting for the service and
# loading the images, and removing every container before stopping it. The sourcing script defines
# `log` and IMAGES.

# Writes the engine's containers.conf to $1. This VM lacks CAP_SYS_RESOURCE: no default
# rlimits, no default pids limit (the provider sets its own). cgroupfs and file events: no
# systemd here.
write_containers_conf() {
  cat > "$1" <<'CONF'
[containers]
default_ulimits = []
pids_limit = 0
[engine]
events_logger = "file"
cgroup_manager = "cgroupfs"
CONF
}

# Waits up to 30 s for the service on $1 to answer, then loads IMAGES into it from the main
# engine; $2 names it in the failure message, whose log is $3.
await_service() {
  local host=$1 what=$2 logfile=$3 img
  for _ in $(seq 1 60); do timeout 5 docker -H "$host" version >/dev/null 2>&1 && break; sleep 0.5; done
  timeout 5 docker -H "$host" version >/dev/null 2>&1 || {
    log "$what did not answer; its log ends with:"
    tail -n 20 "$logfile" >&2
    exit 1
  }
  for img in "${IMAGES[@]}"; do
    docker -H "$host" image inspect "$img" >/dev/null 2>&1 || docker save "$img" | docker -H "$host" load >/dev/null
  done
}

# Removes every container on the service at $1, then ends its process $2 (SIGTERM, SIGKILL after
# 10 s).
stop_service() {
  local host=$1 pid=$2 ids
  ids=$(docker -H "$host" ps -aq 2>/dev/null || true)
  # shellcheck disable=SC2086
  [ -z "$ids" ] || docker -H "$host" rm -f -v $ids >/dev/null 2>&1 || true
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 40); do [ -d "/proc/$pid" ] || break; sleep 0.25; done
  [ ! -d "/proc/$pid" ] || kill -KILL "$pid" 2>/dev/null || true
}
