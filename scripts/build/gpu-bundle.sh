#!/usr/bin/env bash
# Makes one folder that runs the GPU smoke test on a machine with an NVIDIA GPU and driver but no
# container engine and no package registry (the `device` machines): Debian 12's Podman stack
# (podman, conmon, crun, catatonit, containers-common and the libraries they need, as .deb files
# that gpu-check.sh unpacks with dpkg -x there, never installing them; kept packed, they are a
# third of their unpacked size), a minimal glibc image (busybox plus Debian's libc) as a tarball,
# this package's built addon and JS, the bandwidth program (built here with cc), the smoke
# driver and scripts/ci/gpu-check.sh. Node itself is added (xz-compressed) with --with-node, for a
# machine without one. Prints the folder's size; fails when it is not under 64 MiB.
#
#   scripts/build/gpu-bundle.sh [--podman 5|4] [--with-node] [FOLDER]   (default: 5, target/gpu-bundle)
#   scripts/build/gpu-bundle.sh --node-only [FOLDER]                    (default: target/gpu-node)
#
# Node, xz-compressed, is 23 MiB: with the Podman 5 bundle (45 MiB) it would pass 64 MiB. For a
# machine without node, --node-only makes a folder of its own (node.xz and unpack.sh): carry it
# in one call and run `bash FOLDER/unpack.sh` (it writes /tmp/trueforge-gpu-node/node, which
# gpu-check.sh looks for), then carry the bundle in the next call while the machine is warm.
#
# Podman 5 (Debian 13's 5.4, about 35 MB of packages; needs glibc 2.38 or later where it runs)
# is the one whose Docker-compatible API passes CDI devices on, so it is what the GPU step
# needs. Podman 4 (Debian 12's 4.3, 17 MB; runs on glibc 2.36 like this machine) serves the
# provider just as well but drops CDI devices, which the provider then refuses with
# GPU_UNSUPPORTED: it is for checking everything up to the GPU here.
#
# Needs: apt-get (Debian lists; Debian 13's are fetched into a private folder), cc, and the
# addon built (`npm run build`).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)

with_node=0
node_only=0
podman=5
while [ $# -gt 0 ]; do
  case "$1" in
    --with-node) with_node=1; shift ;;
    --node-only) node_only=1; shift ;;
    --podman) podman=${2:-}; shift 2 ;;
    *) break ;;
  esac
done
case "$podman" in 4|5) ;; *) echo "--podman takes 4 or 5" >&2; exit 2 ;; esac
out=${1:-target/gpu-bundle}
limit=$((64 * 1024 * 1024))

log() { printf '[gpu-bundle] %s\n' "$*" >&2; }

if [ "$node_only" = 1 ]; then
  out=${1:-target/gpu-node}
  rm -rf "$out"
  mkdir -p "$out"
  log "compressing node $(node --version) (xz, about 40 s)"
  xz -T2 -6 -c "$(readlink -f "$(command -v node)")" > "$out/node.xz"
  cat > "$out/unpack.sh" <<'UNPACK'
#!/usr/bin/env bash
# Unpacks node to /tmp/trueforge-gpu-node/node, where gpu-check.sh looks for it (xz, else Python's lzma).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p /tmp/trueforge-gpu-node
if command -v xz >/dev/null 2>&1; then xz -dc "$here/node.xz" > /tmp/trueforge-gpu-node/node
else python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' "$here/node.xz" /tmp/trueforge-gpu-node/node
fi
chmod 755 /tmp/trueforge-gpu-node/node
/tmp/trueforge-gpu-node/node --version
UNPACK
  chmod 755 "$out/unpack.sh"
  size=$(du -sb "$out" | cut -f1)
  log "node folder: $out, $((size / 1024 / 1024)) MiB ($size bytes)"
  echo "$size"
  [ "$size" -lt "$limit" ] || { log "too big for one device call"; exit 1; }
  exit 0
fi

# Podman and what it, conmon and the runtimes load beyond glibc (read off their ELF NEEDED
# entries; the check below fails when one is missing).
COMMON=(conmon crun runc catatonit golang-github-containers-common libgpg-error0 libdevmapper1.02.1
  libyajl2 libseccomp2 libcap2 libsystemd0 libselinux1 libaudit1 libcap-ng0 libpcre2-8-0
  liblz4-1 libzstd1 liblzma5 libgcrypt20 libudev1 libsemanage2 libsepol2 libbz2-1.0 libmd0
  libbsd0 libffi8 libmount1 libblkid1 libpam0g zlib1g)
if [ "$podman" = 4 ]; then
  PACKAGES=(podman "${COMMON[@]}" libgpgme11 libassuan0 libsubid4 libglib2.0-0)
else
  PACKAGES=(podman "${COMMON[@]}" netavark libgpgme11t64 libassuan9 libsubid5 libglib2.0-0t64
    libsqlite3-0 libacl1 libatomic1 libattr1 libxxhash0)
fi
IMAGE_PACKAGES=(busybox-static libc6)

addon=$(ls -t trueforge-docker-sandbox.*.node 2>/dev/null | head -1 || true)
[ -n "$addon" ] || { log "no built addon: run npm run build first"; exit 1; }

rm -rf "$out"
mkdir -p "$out"/debs "$out"/pkg
out=$(cd "$out" && pwd)
debs=$(mktemp -d)
trap 'rm -rf "$debs"' EXIT
chmod 755 "$debs"

command -v readelf >/dev/null 2>&1 || { log "readelf is needed (binutils; scripts/ci/ensure-gpu-tools.sh brings it)"; exit 1; }
# A fresh machine may have no package lists yet.
if ! apt-cache show busybox-static >/dev/null 2>&1; then apt-get update -qq; fi
log "downloading ${#PACKAGES[@]} Debian packages for Podman $podman, ${#IMAGE_PACKAGES[@]} for the image"
apt_opts=()
if [ "$podman" = 5 ]; then
  # Debian 13's lists, in a folder of our own: the machine's apt setup is left alone.
  lists="$root/target/apt-trixie"
  mkdir -p "$lists/lists/partial"
  echo "deb http://deb.debian.org/debian trixie main" > "$lists/sources.list"
  apt_opts=(-o "Dir::Etc::sourcelist=$lists/sources.list" -o Dir::Etc::sourceparts=- \
    -o "Dir::State::Lists=$lists/lists" -o APT::Get::List-Cleanup=0)
  apt-get "${apt_opts[@]}" update -qq >/dev/null 2>"$debs/apt.log" || { cat "$debs/apt.log" >&2; exit 1; }
fi
if ! (cd "$debs" && apt-get "${apt_opts[@]}" download "${PACKAGES[@]}" >/dev/null 2>"$debs/apt.log" \
  && apt-get download "${IMAGE_PACKAGES[@]}" >/dev/null 2>>"$debs/apt.log"); then
  log "apt-get download failed (run apt-get update first?):"; cat "$debs/apt.log" >&2; exit 1
fi
for p in "${PACKAGES[@]}"; do cp "$debs/${p}"_*.deb "$out/debs/"; done
echo "$podman" > "$out/debs/PODMAN_MAJOR"

# Every library the binaries need must be in the bundle or be glibc's own: unpack here to see.
check=$(mktemp -d)
for f in "$out"/debs/*.deb; do dpkg -x "$f" "$check"; done
missing=$(
  find "$check" -type f \( -name '*.so*' -o -perm -u+x \) -print0 |
    { xargs -0 -n 50 readelf -d 2>/dev/null || true; } | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | sort -u |
    while read -r lib; do
      case "$lib" in libc.so.6|libm.so.6|libdl.so.2|libpthread.so.0|librt.so.1|ld-linux-x86-64.so.2|libresolv.so.2|libcrypt.so.1|libgcc_s.so.1) continue ;; esac
      find "$check" -name "$lib" | grep -q . || echo "$lib"
    done
)
rm -rf "$check"
if [ -n "$missing" ]; then log "libraries missing from the bundle: $missing"; exit 1; fi

log "making the image: busybox and glibc"
img=$(mktemp -d)
mkdir -p "$img/x"
dpkg -x "$debs"/busybox-static_*.deb "$img/x"
dpkg -x "$debs"/libc6_*.deb "$img/x"
rootfs="$img/rootfs"
mkdir -p "$rootfs"/{bin,sbin,tmp,etc,root,dev,proc,sys,usr/bin,usr/lib/x86_64-linux-gnu,lib64}
cp "$img/x/bin/busybox" "$rootfs/bin/busybox"
for applet in $("$rootfs/bin/busybox" --list); do
  [ "$applet" = busybox ] || ln -sf busybox "$rootfs/bin/$applet"
done
for d in "$img/x/lib/x86_64-linux-gnu" "$img/x/usr/lib/x86_64-linux-gnu"; do
  [ -d "$d" ] && find "$d" -maxdepth 1 -name '*.so*' -exec cp -a {} "$rootfs/usr/lib/x86_64-linux-gnu/" \;
done
[ -e "$rootfs/usr/lib/x86_64-linux-gnu/libc.so.6" ] || { log "no libc.so.6 in Debian's libc6"; exit 1; }
ln -s usr/lib "$rootfs/lib"
ln -sf ../usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 "$rootfs/lib64/ld-linux-x86-64.so.2"
chmod 1777 "$rootfs/tmp"
printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' > "$rootfs/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' > "$rootfs/etc/group"
tar -C "$rootfs" -czf "$out/rootfs.tar.gz" .
rm -rf "$img"

log "adding the addon, its JS, the bandwidth program and the scripts"
# What the published package holds (package.json "files"), so a file added there is never missed.
cp "$addon" package.json "$out/pkg/"
node -p "require('./package.json').files.join('\\n')" | while read -r f; do cp -a "${f%/}" "$out/pkg/"; done
mkdir -p "$out/bench"
cp bench/gpu/bandwidth.c "$out/bench/"
cc -O2 -std=c11 -o "$out/bench/bandwidth" bench/gpu/bandwidth.c -ldl
cp scripts/ci/gpu-check.sh scripts/dev/gpu-smoke.js "$out/"
chmod 755 "$out/gpu-check.sh"
if [ "$with_node" = 1 ]; then
  log "adding node $(node --version) (xz)"
  xz -T2 -6 -c "$(readlink -f "$(command -v node)")" > "$out/node.xz"
fi

size=$(du -sb "$out" | cut -f1)
log "bundle: $out, $((size / 1024 / 1024)) MiB ($size bytes; limit $limit)"
echo "$size"
[ "$size" -lt "$limit" ] || { log "too big for one device call"; exit 1; }
