#!/usr/bin/env bash
# Checks each built binary (trueforge-docker-sandbox.<platform>.node in the root) for its format
# and architecture and for what it needs from the machine that loads it:
# - `file` names the format and CPU: ELF x86-64 / ELF aarch64 / Mach-O x86_64 / Mach-O arm64;
# - Linux: the only libraries it needs are glibc's own (libc, libm, libdl, libpthread, ld-linux)
#   and libgcc_s, and the newest glibc symbol version it needs is printed (at most 2.36:
#   Debian 12, the base of node:24-slim);
# - macOS: the only dylibs it needs are libSystem, libiconv and libcharset (part of every macOS),
#   the minimum macOS version is the one scripts/build/build-all.sh asked for, and the arm64 build has
#   the ad-hoc code signature Apple silicon requires;
# - every one exports `napi_register_module_v1` and does not define the N-API itself: napi-rs
#   (its `dyn-symbols` feature) looks the functions up with dlsym in the Node.js process that
#   loads it, so no N-API symbol is bound to a library at link time (none is undefined either),
#   and the names (`napi_create_function`, ...) are in the binary for that lookup.
# Tools: `file` (Debian) and llvm-nm/llvm-objdump (rustup's llvm-tools component; binutils'
# nm cannot read Mach-O).
set -euo pipefail
cd "$(dirname "$0")/../.."

if ! command -v file >/dev/null; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq file >/dev/null 2>&1 ||
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq file >/dev/null; }
fi
llvm="$(rustc --print sysroot)/lib/rustlib/$(rustc -vV | sed -n 's/^host: //p')/bin"
[ -x "$llvm/llvm-nm" ] || rustup component add llvm-tools >/dev/null 2>&1
nm="$llvm/llvm-nm"
objdump="$llvm/llvm-objdump"

bin=$(node -p "require('./package.json').napi.binaryName")
fail=0
bad() { printf '  FAIL: %s\n' "$*"; fail=1; }

for plat in linux-x64-gnu linux-arm64-gnu darwin-x64 darwin-arm64; do
  f="$bin.$plat.node"
  echo "== $f ($(stat -c %s "$f") bytes)"
  desc=$(file -b "$f")
  echo "  file: $desc"
  case "$plat" in
    linux-x64-gnu) want='^ELF 64-bit LSB shared object, x86-64' ;;
    linux-arm64-gnu) want='^ELF 64-bit LSB shared object, ARM aarch64' ;;
    darwin-x64) want='^Mach-O 64-bit x86_64 dynamically linked shared library' ;;
    darwin-arm64) want='^Mach-O 64-bit arm64 dynamically linked shared library' ;;
  esac
  grep -Eq "$want" <<<"$desc" || bad "format/architecture is not /$want/"

  exports=$("$nm" -g --defined-only "$f" 2>/dev/null || "$nm" -D --defined-only "$f")
  undefined=$("$nm" -u "$f" 2>/dev/null || true)
  case "$plat" in
    linux-*)
      needed=$(readelf -d "$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' ')
      echo "  needs: $needed"
      for lib in $needed; do
        grep -Eq '^(libc\.so\.6|libm\.so\.6|libdl\.so\.2|libpthread\.so\.0|librt\.so\.1|libgcc_s\.so\.1|ld-linux-(x86-64|aarch64)\.so\.[12])$' <<<"$lib" ||
          bad "links $lib, which is not part of glibc"
      done
      glibc=$(readelf -V "$f" | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -n 1)
      echo "  newest glibc symbol version: $glibc"
      [ "$(printf '%s\n2.36\n' "$glibc" | sort -V | tail -n 1)" = 2.36 ] || bad "needs glibc $glibc, newer than Debian 12's 2.36"
      exports=$("$nm" -D --defined-only "$f")
      undefined=$("$nm" -D -u "$f")
      prefix=''
      ;;
    darwin-*)
      dylibs=$("$objdump" --macho --dylibs-used "$f" | tail -n +2 | awk '{print $1}')
      id=$("$objdump" --macho --dylib-id "$f" | tail -n +2 | awk '{print $1}')
      dylibs=$(grep -vxF "$id" <<<"$dylibs" | tr '\n' ' ')
      echo "  needs: $dylibs"
      for lib in $dylibs; do
        grep -Eq '^/usr/lib/(libSystem\.B|libiconv\.2|libcharset\.1)\.dylib$' <<<"$lib" ||
          bad "links $lib, which is not part of macOS"
      done
      headers=$("$objdump" --macho --private-headers "$f")
      minos=$(awk '/cmd LC_BUILD_VERSION/ { b = 1 } b && $1 == "minos" { print $2; exit }' <<<"$headers")
      want_minos=$([ "$plat" = darwin-x64 ] && echo 10.15 || echo 11.0)
      echo "  minimum macOS: $minos"
      [ "$minos" = "$want_minos" ] || bad "minimum macOS is $minos, not $want_minos"
      if [ "$plat" = darwin-arm64 ]; then
        if grep -q 'cmd LC_CODE_SIGNATURE' <<<"$headers"; then echo "  code signature: present"; else bad "no code signature (Apple silicon refuses to load it)"; fi
      fi
      prefix='_'
      ;;
  esac
  grep -Eq " T ${prefix}napi_register_module_v1$" <<<"$exports" || bad "does not export ${prefix}napi_register_module_v1"
  if grep -Eq "^ *(U )?${prefix}napi_" <<<"$undefined" || grep -Eq " [TtDd] ${prefix}napi_create_function$" <<<"$exports"; then
    bad "binds N-API symbols at link time"
  fi
  grep -Eq "^ *(U )?${prefix}dlsym(@.*)?$" <<<"$undefined" || bad "does not import dlsym (for the N-API lookup)"
  napi_names=$(strings -a "$f" | grep -c '^napi_[a-z_0-9]*$' || true)
  grep -qx napi_create_function < <(strings -a "$f") || bad "napi_create_function is not named in the binary"
  echo "  N-API: napi_register_module_v1 exported; $napi_names napi_* functions looked up at load (dlsym), none bound at link time"
done

if [ "$fail" = 0 ]; then echo "[check-binaries] all four binaries are as expected"; else echo "[check-binaries] FAILED" >&2; exit 1; fi
