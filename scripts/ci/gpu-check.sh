#!/usr/bin/env bash
# The GPU smoke test on a machine with an NVIDIA GPU and driver but no container engine and no
# package registry, from the folder scripts/build/gpu-bundle.sh makes (run it from there as root):
#   1. unpacks Debian's Podman from the folder's .deb files (dpkg -x, into $GPU_CHECK_WORK;
#      nothing is installed), configures it (its own config, storage and run folders there) and
#      imports the bundle's glibc image;
#   2. starts Podman's Docker-compatible service on a socket of its own;
#   3. runs a sandbox round trip without GPUs through this package's provider;
#   4. if there is an NVIDIA GPU: writes a CDI spec (/var/run/cdi/trueforge-gpu-check.json) for
#      the host's /dev/nvidia* nodes, driver libraries and nvidia-smi (no NVIDIA toolkit needed)
#      and runs the GPU smoke test (gpu-smoke.js): nvidia-smi's view from the sandboxes, and the
#      bandwidth in a sandbox vs on the host with their ratio.
#   Without a GPU, step 4 is instead a CDI check with two fake devices (a spec mounting one file
#   each): a CDI name through Podman, and exclusive allocation found from that spec.
# Exit: 0 all checks held; 1 a check failed; 2 setup failed; 3 no GPU here: stopped (cleanly)
# before the GPU step after steps 1 to 3 and the fake-device CDI check worked.
set -euo pipefail

B=$(cd "$(dirname "$0")" && pwd)
W=${GPU_CHECK_WORK:-/tmp/trueforge-gpu-check}
P="$W/podman"
SOCK="$W/podman.sock"
IMAGE=trueforge-gpu-check:1
SPEC=/var/run/cdi/trueforge-gpu-check.json
FAKE_SPEC=/var/run/cdi/trueforge-gpu-check-fake.json
# runc by default: crun 1.8 refuses hosts with hybrid cgroups (v1 controllers plus a v2 mount).
RUNTIME=${GPU_CHECK_RUNTIME:-runc}

log() { printf '[gpu-check] %s\n' "$*" >&2; }
die() { log "$*"; exit 2; }

[ "$(id -u)" = 0 ] || die "run as root (Podman runs rootful here)"
ls "$B"/debs/podman_*.deb >/dev/null 2>&1 || die "no debs/podman_*.deb beside this script: run it from a folder made by scripts/build/gpu-bundle.sh"
command -v dpkg >/dev/null 2>&1 || die "dpkg is needed to unpack the bundle's packages"
if [ ! -x "$P/usr/bin/podman" ]; then
  mkdir -p "$P"
  for f in "$B"/debs/*.deb; do dpkg -x "$f" "$P"; done
fi

glibc=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')
major=$(cat "$B/debs/PODMAN_MAJOR" 2>/dev/null || echo 4)
need=$([ "$major" = 5 ] && echo 2.38 || echo 2.36)
log "host: $(uname -sr), glibc $glibc; the bundle's Podman $major needs glibc $need or later"
if [ "$(printf '%s\n%s\n' "$need" "$glibc" | sort -V | head -1)" != "$need" ]; then
  die "glibc $glibc is older than $need: make the bundle with scripts/build/gpu-bundle.sh --podman 4 (it stops at the GPU step: Podman 4 drops CDI devices)"
fi

mkdir -p "$W"/{run,storage,tmp,libpod,volumes}
# The bundle's libraries for Podman and what it runs (conmon, crun) only, not for node.
LIBS="$P/usr/lib/x86_64-linux-gnu:$P/lib/x86_64-linux-gnu"
# Podman runs conmon and crun with an environment of its own: wrappers give them the libraries.
mkdir -p "$W/bin"
for tool in conmon crun runc; do
  printf '#!/bin/sh\nLD_LIBRARY_PATH="%s" exec "%s" "$@"\n' "$LIBS" "$P/usr/bin/$tool" > "$W/bin/$tool"
  chmod 755 "$W/bin/$tool"
done
export CONTAINERS_CONF="$W/containers.conf" CONTAINERS_STORAGE_CONF="$W/storage.conf" CONTAINERS_REGISTRIES_CONF="$W/registries.conf"
# This kind of VM lacks CAP_SYS_RESOURCE: no ulimits, no pids limit by default.
cat > "$CONTAINERS_CONF" <<CONF
[containers]
default_ulimits = []
pids_limit = 0
log_driver = "k8s-file"

[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = "$W/events.log"
conmon_path = ["$W/bin/conmon"]
init_path = "$P/usr/libexec/podman/catatonit"
helper_binaries_dir = ["$P/usr/libexec/podman", "$P/usr/lib/podman"]
runtime = "$RUNTIME"
static_dir = "$W/libpod"
tmp_dir = "$W/tmp"
volume_path = "$W/volumes"

[engine.runtimes]
crun = ["$W/bin/crun"]
runc = ["$W/bin/runc"]
CONF
cat > "$CONTAINERS_STORAGE_CONF" <<CONF
[storage]
driver = "vfs"
runroot = "$W/run"
graphroot = "$W/storage"
CONF
echo 'unqualified-search-registries = []' > "$CONTAINERS_REGISTRIES_CONF"
if [ ! -f /etc/containers/policy.json ]; then
  mkdir -p /etc/containers
  echo '{"default":[{"type":"insecureAcceptAnything"}]}' > /etc/containers/policy.json
fi
pm() { LD_LIBRARY_PATH="$LIBS" "$P/usr/bin/podman" --root "$W/storage" --runroot "$W/run" "$@"; }

service_pid=""
cleanup() {
  rm -f "$SPEC" "$FAKE_SPEC"
  if [ -n "$service_pid" ]; then
    for id in $(pm ps -aq --filter label=trueforge.sandbox.namespace=gpu-check 2>/dev/null); do
      pm rm -f "$id" >/dev/null 2>&1 || true
    done
    kill "$service_pid" 2>/dev/null || true
  fi
}
trap cleanup EXIT

log "podman $(pm --version | awk '{print $3}'); importing the image"
if ! pm image exists "$IMAGE"; then pm import "$B/rootfs.tar.gz" "$IMAGE" >/dev/null || die "podman import failed"; fi

NODE=${NODE:-$(command -v node || true)}
[ -n "$NODE" ] || { [ -x /tmp/trueforge-gpu-node/node ] && NODE=/tmp/trueforge-gpu-node/node; } || true
if [ -z "$NODE" ] && [ -f "$B/node.xz" ]; then
  xz -dc "$B/node.xz" > "$W/node" && chmod 755 "$W/node" && NODE="$W/node"
fi
[ -n "$NODE" ] || die "no node here: carry a folder made by gpu-bundle.sh --node-only and run its unpack.sh first (or make this bundle --with-node, if it fits)"

rm -f "$SOCK"
log "starting the Podman service on unix://$SOCK (log: $W/service.log)"
LD_LIBRARY_PATH="$LIBS" setsid "$P/usr/bin/podman" --root "$W/storage" --runroot "$W/run" system service --time=0 "unix://$SOCK" > "$W/service.log" 2>&1 < /dev/null &
service_pid=$!
for _ in $(seq 1 60); do
  if "$NODE" -e "require('http').get({socketPath:'$SOCK',path:'/_ping'},r=>process.exit(r.statusCode===200?0:1)).on('error',()=>process.exit(1))"; then break; fi
  sleep 0.5
done
"$NODE" -e "require('http').get({socketPath:'$SOCK',path:'/_ping'},r=>process.exit(r.statusCode===200?0:1)).on('error',()=>process.exit(1))" \
  || { tail -n 20 "$W/service.log" >&2; die "the Podman service did not answer"; }

export SMOKE_PKG="$B/pkg" SMOKE_HOST="unix://$SOCK" SMOKE_IMAGE="$IMAGE" SMOKE_BANDWIDTH="$B/bench/bandwidth"
log "a sandbox round trip without GPUs, through the provider"
"$NODE" "$B/gpu-smoke.js" round-trip || { tail -n 20 "$W/service.log" >&2; exit 1; }

if [ ! -e /dev/nvidiactl ]; then
  log "no NVIDIA GPU here (no /dev/nvidiactl): checking CDI with two fake devices instead"
  mkdir -p "$W/fake" "$(dirname "$FAKE_SPEC")"
  echo "fake gpu 0" > "$W/fake/gpu0"
  echo "fake gpu 1" > "$W/fake/gpu1"
  cat > "$FAKE_SPEC" <<SPECJSON
{"cdiVersion":"0.5.0","kind":"trueforge.test/gpu","devices":[
 {"name":"0","containerEdits":{"mounts":[{"hostPath":"$W/fake/gpu0","containerPath":"/run/trueforge-fake-gpu/0","options":["ro","bind"]}]}},
 {"name":"1","containerEdits":{"mounts":[{"hostPath":"$W/fake/gpu1","containerPath":"/run/trueforge-fake-gpu/1","options":["ro","bind"]}]}},
 {"name":"all","containerEdits":{"mounts":[{"hostPath":"$W/fake/gpu0","containerPath":"/run/trueforge-fake-gpu/0","options":["ro","bind"]},{"hostPath":"$W/fake/gpu1","containerPath":"/run/trueforge-fake-gpu/1","options":["ro","bind"]}]}}]}
SPECJSON
  "$NODE" "$B/gpu-smoke.js" cdi-fake || { tail -n 20 "$W/service.log" >&2; exit 1; }
  log "no NVIDIA GPU here: stopping before the GPU step; the Podman service, a sandbox round trip and the fake-device CDI check through the provider passed"
  exit 3
fi

# The driver's libraries: where libcuda.so.1 is, else the usual places.
libdir=$(ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 .*x86-64/ {print $NF; exit}' | xargs -r dirname)
for d in $libdir /usr/local/nvidia/lib64 /usr/lib/x86_64-linux-gnu /usr/lib64; do
  if [ -e "$d/libcuda.so.1" ]; then libdir=$d; break; fi
done
[ -e "$libdir/libcuda.so.1" ] || die "no libcuda.so.1 found (looked in ldconfig's cache, /usr/local/nvidia/lib64, /usr/lib/x86_64-linux-gnu, /usr/lib64)"
smi=$(command -v nvidia-smi || ls /usr/local/nvidia/bin/nvidia-smi 2>/dev/null || true)
log "driver libraries in $libdir; nvidia-smi at ${smi:-nowhere}"

mkdir -p "$(dirname "$SPEC")"
"$NODE" - "$libdir" "$smi" "$SPEC" <<'JS'
const fs = require('node:fs')
const path = require('node:path')
const [libdir, smi, spec] = process.argv.slice(2)
const gpus = fs.readdirSync('/dev').filter((n) => /^nvidia\d+$/.test(n)).sort((a, b) => Number(a.slice(6)) - Number(b.slice(6)))
const common = ['nvidiactl', 'nvidia-uvm', 'nvidia-uvm-tools', 'nvidia-modeset'].filter((n) => fs.existsSync(`/dev/${n}`)).map((n) => ({ path: `/dev/${n}` }))
const ro = ['ro', 'nosuid', 'nodev', 'bind']
// Each driver library under the name it is loaded by (sonames and full versions alike).
const mounts = fs
  .readdirSync(libdir)
  .filter((n) => /^(libcuda|libnvidia-[a-z0-9-]+)\.so(\.[0-9.]+)?$/.test(n))
  .map((n) => ({ hostPath: fs.realpathSync(path.join(libdir, n)), containerPath: `/usr/lib/x86_64-linux-gnu/${n}`, options: ro }))
if (smi) mounts.push({ hostPath: fs.realpathSync(smi), containerPath: '/usr/bin/nvidia-smi', options: ro })
const doc = {
  cdiVersion: '0.5.0',
  kind: 'nvidia.com/gpu',
  devices: [
    ...gpus.map((g) => ({ name: g.slice(6), containerEdits: { deviceNodes: [{ path: `/dev/${g}` }] } })),
    { name: 'all', containerEdits: { deviceNodes: gpus.map((g) => ({ path: `/dev/${g}` })) } },
  ],
  containerEdits: { deviceNodes: common, mounts },
}
fs.writeFileSync(spec, JSON.stringify(doc, null, 2))
console.error(`[gpu-check] CDI spec ${spec}: ${gpus.length} GPU(s), ${common.length} shared nodes, ${mounts.length} mounts`)
JS

log "the GPU smoke test, through the provider"
set +e
"$NODE" "$B/gpu-smoke.js" gpu
rc=$?
set -e
[ "$rc" = 0 ] || tail -n 20 "$W/service.log" >&2
exit "$rc"
