#!/usr/bin/env bash
# Makes the local images the demo and tests use (no container registry is reachable here):
#   trueforge-sandbox-busybox:1   tiny, busybox only, no bash, no python
#   trueforge-sandbox-debian:12   Debian bookworm minbase with python3 (3.11), pydantic 1.10, git,
#                                 bash: an image TrueForge's skill init fails on (pydantic v1)
#   trueforge-sandbox:2           the recommended TrueForge-ready image, made offline: the
#                                 equivalent of images/trueforge/Dockerfile (Debian 13 with the
#                                 Dockerfile's package pins, read from that file; the Python
#                                 packages of images/trueforge/requirements.txt, same pins and
#                                 hashes; user `agent`, uid 1000, home and working directory
#                                 /home/agent). It lacks helm (its download site is unreachable).
# Images that already exist are reused; trueforge-sandbox:2 is made again when the Dockerfile or
# requirements.txt changed since it was made (its label trueforge.image.recipe). Pass `busybox`,
# `debian` or `trueforge` to make only one; `all` (the default) makes all three.
set -euo pipefail

BUSYBOX_IMAGE=${TF_BUSYBOX_IMAGE:-trueforge-sandbox-busybox:1}
DEBIAN_IMAGE=${TF_DEBIAN_IMAGE:-trueforge-sandbox-debian:12}
TRUEFORGE_IMAGE=${TF_TRUEFORGE_IMAGE:-trueforge-sandbox:2}
TRUEFORGE_DOCKERFILE=${TF_TRUEFORGE_DOCKERFILE:-$(cd "$(dirname "$0")/../.." && pwd)/images/trueforge/Dockerfile}
TRUEFORGE_REQUIREMENTS=${TF_TRUEFORGE_REQUIREMENTS:-$(dirname "$TRUEFORGE_DOCKERFILE")/requirements.txt}
want=${1:-all}

log() { printf '[images] %s\n' "$*" >&2; }
have() { docker image inspect "$1" >/dev/null 2>&1; }
apt_ready=0
apt_install() {
  export DEBIAN_FRONTEND=noninteractive
  if [ "$apt_ready" = 0 ]; then apt-get update -qq; apt_ready=1; fi
  apt-get install -y -qq "$@" >/dev/null
}

make_busybox() {
  if have "$BUSYBOX_IMAGE"; then log "$BUSYBOX_IMAGE present"; return; fi
  [ -x /bin/busybox ] && /bin/busybox --list >/dev/null 2>&1 && ldd /bin/busybox 2>&1 | grep -q 'not a dynamic' \
    || apt_install busybox-static
  local root; root=$(mktemp -d)
  trap 'rm -rf "$root"' RETURN
  mkdir -p "$root"/bin "$root"/tmp "$root"/etc "$root"/root
  cp /bin/busybox "$root"/bin/busybox
  for applet in $(/bin/busybox --list); do
    [ "$applet" = busybox ] || ln -sf busybox "$root/bin/$applet"
  done
  chmod 1777 "$root"/tmp
  printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' > "$root"/etc/passwd
  printf 'root:x:0:\nnogroup:x:65534:\n' > "$root"/etc/group
  tar -C "$root" -c . | docker import -c 'ENV PATH=/bin' - "$BUSYBOX_IMAGE" >/dev/null
  log "made $BUSYBOX_IMAGE"
}

make_debian() {
  if have "$DEBIAN_IMAGE"; then log "$DEBIAN_IMAGE present"; return; fi
  command -v mmdebstrap >/dev/null 2>&1 || apt_install mmdebstrap
  local out; out=$(mktemp -d)
  trap 'rm -rf "$out"' RETURN
  log "building $DEBIAN_IMAGE with mmdebstrap (about 30 s)"
  mmdebstrap --quiet --variant=minbase \
    --include=bash,python3,python3-pydantic,git,ca-certificates,procps \
    bookworm "$out/rootfs.tar"
  docker import \
    -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    -c 'ENV LANG=C.UTF-8' \
    "$out/rootfs.tar" "$DEBIAN_IMAGE" >/dev/null
  log "made $DEBIAN_IMAGE"
}

# The `name=version` pins of the Dockerfile's apt-get install, comma-separated.
trueforge_pins() {
  grep -E '^[[:space:]]+[a-z0-9][a-z0-9.+-]*=[^[:space:]]+[[:space:]]*\\$' "$TRUEFORGE_DOCKERFILE" \
    | sed -E 's/^[[:space:]]+//; s/[[:space:]]*\\$//' | paste -sd, -
}

# What the offline image is made from: a changed Dockerfile or requirements.txt makes it again.
trueforge_recipe() {
  cat "$TRUEFORGE_DOCKERFILE" "$TRUEFORGE_REQUIREMENTS" | sha256sum | cut -c1-16
}

make_trueforge() {
  local recipe; recipe=$(trueforge_recipe)
  if have "$TRUEFORGE_IMAGE"; then
    local made
    made=$(docker image inspect --format '{{index .Config.Labels "trueforge.image.recipe"}}' "$TRUEFORGE_IMAGE" 2>/dev/null || true)
    if [ "$made" = "$recipe" ]; then log "$TRUEFORGE_IMAGE present"; return; fi
    log "$TRUEFORGE_IMAGE was made from another recipe (${made:-none}, now $recipe): making it again"
  fi
  command -v mmdebstrap >/dev/null 2>&1 || apt_install mmdebstrap
  local pins; pins=$(trueforge_pins)
  if [ -z "$pins" ]; then log "no package pins found in $TRUEFORGE_DOCKERFILE"; exit 1; fi
  local out; out=$(mktemp -d)
  trap 'rm -rf "$out"' RETURN
  local t0=$SECONDS
  # The wheels, on the host (the rootfs gets no network of its own for this): CPython 3.13 on
  # x86_64 glibc, binary only, every pin checked against its hash.
  if ! python3 -m pip --version >/dev/null 2>&1; then apt_install python3-pip; fi
  log "downloading the Python packages of $TRUEFORGE_REQUIREMENTS"
  python3 -m pip download --quiet --no-cache-dir --no-deps --only-binary=:all: \
    --python-version 3.13 --implementation cp --abi cp313 --abi abi3 --abi none \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 \
    --require-hashes -r "$TRUEFORGE_REQUIREMENTS" -d "$out/wheels" \
    || { log "pip download failed: if a pin no longer resolves, update $TRUEFORGE_REQUIREMENTS"; exit 1; }
  cp "$TRUEFORGE_REQUIREMENTS" "$out/requirements.txt"
  log "building $TRUEFORGE_IMAGE with mmdebstrap (about a minute): ${pins//,/ }"
  # No mirror argument: mmdebstrap then uses Debian's default mirror with trixie-updates and
  # trixie-security, as debian:13-slim does (the pins include security updates).
  # The wheels are installed offline by the rootfs's own pip (a clean environment: the host's
  # pip settings are not the rootfs's), then checked the way TrueForge uses them.
  mmdebstrap --quiet --variant=minbase --components=main \
    --include="$pins" \
    --customize-hook="mkdir -p \"\$1/tmp/tf-wheels\" && cp -r '$out/wheels/.' '$out/requirements.txt' \"\$1/tmp/tf-wheels/\"" \
    --customize-hook='chroot "$1" env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 python3 -m pip install --quiet --no-cache-dir --no-index --find-links /tmp/tf-wheels --break-system-packages --root-user-action=ignore --only-binary=:all: --require-hashes -r /tmp/tf-wheels/requirements.txt' \
    --customize-hook='rm -rf "$1/tmp/tf-wheels"' \
    --customize-hook='chroot "$1" env -i PATH=/usr/local/bin:/usr/bin:/bin python3 -c "from pydantic import field_validator, ConfigDict" && chroot "$1" env -i PATH=/usr/local/bin:/usr/bin:/bin genson --version >/dev/null' \
    --customize-hook='chroot "$1" useradd --create-home --uid 1000 --user-group --shell /bin/bash agent' \
    trixie "$out/rootfs.tar" \
    || { log "mmdebstrap failed: if a pin no longer resolves, update the pins in $TRUEFORGE_DOCKERFILE (see its comments)"; exit 1; }
  docker import \
    -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    -c 'ENV LANG=C.UTF-8' \
    -c 'USER agent' \
    -c 'WORKDIR /home/agent' \
    -c "LABEL trueforge.image.recipe=$recipe" \
    "$out/rootfs.tar" "$TRUEFORGE_IMAGE" >/dev/null
  log "made $TRUEFORGE_IMAGE in $((SECONDS - t0)) s"
}

case "$want" in
  busybox) make_busybox ;;
  debian) make_debian ;;
  trueforge) make_trueforge ;;
  all) make_busybox; make_debian; make_trueforge ;;
  *) log "unknown image '$want' (busybox, debian, trueforge or all)"; exit 2 ;;
esac
