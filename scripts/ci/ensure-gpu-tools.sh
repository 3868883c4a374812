#!/usr/bin/env bash
# What the GPU checks need on a machine without a GPU: a C compiler for bench/gpu/bandwidth.c,
# and NVIDIA's PTX assembler (`ptxas`, from the nvidia-cuda-nvcc-cu12 Python wheel, unpacked and
# never installed) so the benchmark's PTX is assembled for real GPU architectures here too.
# Prints nothing on stdout; ptxas ends up at $PTXAS_DIR/nvidia/cuda_nvcc/bin/ptxas.
set -euo pipefail

PTXAS_DIR=${PTXAS_DIR:-/opt/trueforge-ptxas}
NVCC_WHEEL=nvidia-cuda-nvcc-cu12==12.9.86

log() { printf '[gpu-tools] %s\n' "$*" >&2; }
apt_ready=0
apt_install() {
  export DEBIAN_FRONTEND=noninteractive
  if [ "$apt_ready" = 0 ]; then apt-get update -qq; apt_ready=1; fi
  apt-get install -y -qq "$@" >/dev/null
}

if ! command -v cc >/dev/null 2>&1 || [ ! -f /usr/include/dlfcn.h ]; then
  log "installing a C compiler"
  apt_install gcc libc6-dev
fi

if [ -x "$PTXAS_DIR/nvidia/cuda_nvcc/bin/ptxas" ]; then
  log "ptxas present"
  exit 0
fi
if ! python3 -m pip --version >/dev/null 2>&1; then
  log "installing pip"
  apt_install python3-pip
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
log "fetching ptxas ($NVCC_WHEEL)"
python3 -m pip download -q --no-deps --only-binary=:all: "$NVCC_WHEEL" -d "$tmp" >&2
mkdir -p "$PTXAS_DIR"
python3 - "$tmp" "$PTXAS_DIR" <<'PY'
import glob, sys, zipfile
wheel = glob.glob(sys.argv[1] + "/*.whl")[0]
with zipfile.ZipFile(wheel) as z:
    z.extract("nvidia/cuda_nvcc/bin/ptxas", sys.argv[2])
PY
chmod 755 "$PTXAS_DIR/nvidia/cuda_nvcc/bin/ptxas"
log "ptxas at $PTXAS_DIR/nvidia/cuda_nvcc/bin/ptxas"
