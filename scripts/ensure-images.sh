#!/usr/bin/env bash
# Makes the local images the demo and tests use (no registry is reachable here):
#   trueforge-sandbox-busybox:1   tiny, busybox only, no bash, no python
#   trueforge-sandbox-debian:12   Debian bookworm minbase with python3, pydantic, git, bash
#   trueforge-sandbox:1           the recommended TrueForge-ready image, made offline: the
#                                 equivalent of images/trueforge/Dockerfile (same Debian sources
#                                 and package pins, read from that file; user `agent`, uid 1000,
#                                 home and working directory /home/agent)
# Images that already exist are reused. Pass `busybox`, `debian` or `trueforge` to make only
# one; `all` (the default) makes all three.
set -euo pipefail

BUSYBOX_IMAGE=${TF_BUSYBOX_IMAGE:-trueforge-sandbox-busybox:1}
DEBIAN_IMAGE=${TF_DEBIAN_IMAGE:-trueforge-sandbox-debian:12}
TRUEFORGE_IMAGE=${TF_TRUEFORGE_IMAGE:-trueforge-sandbox:1}
TRUEFORGE_DOCKERFILE=${TF_TRUEFORGE_DOCKERFILE:-$(cd "$(dirname "$0")/.." && pwd)/images/trueforge/Dockerfile}
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

make_trueforge() {
  if have "$TRUEFORGE_IMAGE"; then log "$TRUEFORGE_IMAGE present"; return; fi
  command -v mmdebstrap >/dev/null 2>&1 || apt_install mmdebstrap
  local pins; pins=$(trueforge_pins)
  if [ -z "$pins" ]; then log "no package pins found in $TRUEFORGE_DOCKERFILE"; exit 1; fi
  local out; out=$(mktemp -d)
  trap 'rm -rf "$out"' RETURN
  log "building $TRUEFORGE_IMAGE with mmdebstrap (about a minute): ${pins//,/ }"
  # The sources debian:bookworm-slim ships with: the pins include versions from
  # bookworm-security (ca-certificates, jq).
  mmdebstrap --quiet --variant=minbase --components=main \
    --include="$pins" \
    --customize-hook='chroot "$1" useradd --create-home --uid 1000 --user-group --shell /bin/bash agent' \
    bookworm "$out/rootfs.tar" \
    "deb http://deb.debian.org/debian bookworm main" \
    "deb http://deb.debian.org/debian bookworm-updates main" \
    "deb http://deb.debian.org/debian-security bookworm-security main" \
    || { log "mmdebstrap failed: if a pin no longer resolves, update the pins in $TRUEFORGE_DOCKERFILE (see its comments)"; exit 1; }
  docker import \
    -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    -c 'ENV LANG=C.UTF-8' \
    -c 'USER agent' \
    -c 'WORKDIR /home/agent' \
    "$out/rootfs.tar" "$TRUEFORGE_IMAGE" >/dev/null
  log "made $TRUEFORGE_IMAGE"
}

case "$want" in
  busybox) make_busybox ;;
  debian) make_debian ;;
  trueforge) make_trueforge ;;
  all) make_busybox; make_debian; make_trueforge ;;
  *) log "unknown image '$want' (busybox, debian, trueforge or all)"; exit 2 ;;
esac
