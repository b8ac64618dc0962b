#!/usr/bin/env bash
# Fetches Debian sid's Rust toolchain for cross-compiling the provisioner to the image's foreign
# platforms and prints the path of a `rustc` cargo can use (RUSTC=...).
#
# Usage: hack/fetch-cross-rust.sh [ARCH...]   (Debian arch names; default: arm64)
#   arm64    linux/arm64    aarch64-unknown-linux-gnu
#   ppc64el  linux/ppc64le  powerpc64le-unknown-linux-gnu
#   s390x    linux/s390x    s390x-unknown-linux-gnu
#
# Why sid: the crate needs Rust >= 1.88 and a standard library for each of these targets.
# rustup's server is not reachable from the machines this project builds on, and bookworm's
# rustc is too old; sid (deb.debian.org) ships a current rustc for amd64 and libstd-rust-dev for
# every release architecture, built from the same source upload. No prebuilt toolchain archive is
# downloaded: only Debian packages, checked end to end (InRelease signed by a key in the host's
# debian-archive-keyring -> Packages.xz sha256 -> each .deb's SHA256) and unpacked with
# `dpkg-deb -x` (nothing is installed) into
#   ${HPP_CACHE_DIR:-~/.cache/hostpath-provisioner}/cross-rust/<rustc version>/
# The target std must be at exactly rustc's Debian version (rustc refuses a std from another
# compiler); when sid's build for an arch lags behind rustc's, this script fails and says so
# rather than mixing versions.
#
# sid's rustc needs a newer glibc (>= 2.39), libstdc++ and libllvm than bookworm has, so sid's
# own runtime libraries (libc6, libstdc++6, libllvm22 and their dependencies) are unpacked too,
# and the printed `bin/rustc` is a wrapper that starts sid's rustc through sid's dynamic loader
# with --library-path (no LD_LIBRARY_PATH: the linker and build scripts rustc starts run with the
# host's libraries). The target's C code (ring) and the link use the host's cross gcc and libc
# (gcc-<gnu triple>, libc6-dev-<arch>-cross).
#
# A toolchain already in the cache with every requested arch's std is reused without any network
# access (HPP_CROSS_RUST_REFRESH=1 checks sid again). One that lacks an arch's std is extended in
# place (marker `.std-<arch>`) when sid still has rustc at the cached version; when sid has moved
# on, a new toolchain at sid's version is fetched with the union of the cached and requested
# arches (its cross target dir then starts cold).
set -euo pipefail

MIRROR="${HPP_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
SUITE="${HPP_CROSS_RUST_SUITE:-sid}"
KEYRING="${HPP_DEBIAN_KEYRING:-/usr/share/keyrings/debian-archive-keyring.gpg}"
CACHE="${HPP_CACHE_DIR:-$HOME/.cache/hostpath-provisioner}/cross-rust"
MIN_RUST="1.88"

log() { echo "fetch-cross-rust: $*" >&2; }
die() { log "$*"; exit 1; }

# triple ARCH: the Rust target whose std Debian's libstd-rust-dev:ARCH ships.
triple() {
  case "$1" in
    arm64) echo aarch64-unknown-linux-gnu ;;
    ppc64el) echo powerpc64le-unknown-linux-gnu ;;
    s390x) echo s390x-unknown-linux-gnu ;;
    *) return 1 ;;
  esac
}

# platform ARCH: the OCI platform's architecture (Debian's ppc64el is linux/ppc64le).
platform() { if [ "$1" = ppc64el ]; then echo ppc64le; else echo "$1"; fi; }

arches=("$@")
[ "${#arches[@]}" -gt 0 ] || arches=(arm64)
for arch in "${arches[@]}"; do
  triple "$arch" >/dev/null || die "unknown arch $arch: arm64, ppc64el or s390x (Debian's names)"
done

# has_std DIR ARCH: DIR (a complete toolchain) holds ARCH's std. Toolchains fetched before the
# per-arch markers existed held arm64's alone, listed in their `packages`.
has_std() {
  [ -f "$1/.complete" ] && [ -d "$1/root/usr/lib/rustlib/$(triple "$2")/lib" ] || return 1
  [ -f "$1/.std-$2" ] && return 0
  [ "$2" = arm64 ] && [ ! -e "$1/.std-markers" ] && grep -q '^arm64 .*/libstd-rust-dev_' "$1/packages" 2>/dev/null
}

# ready: the current toolchain holds every requested arch's std; prints its rustc.
ready() {
  [ -z "${HPP_CROSS_RUST_REFRESH:-}" ] && [ -f "$CACHE/current/.complete" ] || return 1
  local dir arch
  dir="$(cd "$CACHE/current" && pwd -P)"
  for arch in "${arches[@]}"; do has_std "$dir" "$arch" || return 1; done
  echo "$dir/bin/rustc"
}

ready && exit 0

for tool in curl xz dpkg-deb sha256sum gpgv awk flock; do
  command -v "$tool" >/dev/null || die "$tool not found"
done
[ -f "$KEYRING" ] || die "$KEYRING not found (apt-get install debian-archive-keyring)"

mkdir -p "$CACHE"
# One fetch at a time (make image and a test may ask at once); the second finds the first's work.
exec 9>"$CACHE/.lock"
flock 9
ready && exit 0

work="$(mktemp -d "$CACHE/.fetch.XXXXXX")"
trap 'rm -rf "$work"' EXIT

log "checking $MIRROR/dists/$SUITE/InRelease"
curl -fsSL --retry 3 -o "$work/InRelease" "$MIRROR/dists/$SUITE/InRelease"
gpgv --keyring "$KEYRING" --output "$work/Release" "$work/InRelease" 2>"$work/gpgv.log" \
  || { cat "$work/gpgv.log" >&2; die "InRelease of $SUITE is not signed by a key in $KEYRING"; }

# index ARCH: the suite's main Packages for ARCH, its sha256 checked against Release.
index() {
  local arch="$1" path="main/binary-$1/Packages.xz" want
  [ -f "$work/Packages-$arch" ] && return 0
  want="$(awk -v p="$path" '/^SHA256:/{s=1;next} /^[^ ]/{s=0} s && $3==p {print $1}' "$work/Release")"
  [ -n "$want" ] || die "Release lists no $path"
  curl -fsSL --retry 3 -o "$work/Packages-$arch.xz" "$MIRROR/dists/$SUITE/$path"
  echo "$want  $work/Packages-$arch.xz" | sha256sum -c --quiet - || die "$path: sha256 mismatch"
  xz -dc "$work/Packages-$arch.xz" >"$work/Packages-$arch"
}

# field ARCH PACKAGE FIELD: one field of PACKAGE's (first) stanza.
field() {
  awk -v pkg="$2" -v f="$3" '
    /^Package: /{cur=$2} /^$/{if(done)exit; cur=""}
    cur==pkg && index($0, f": ")==1 {print substr($0, length(f)+3); done=1}
  ' "$work/Packages-$1"
}

index amd64
version="$(field amd64 rustc Version)"
[ -n "$version" ] || die "no rustc in $SUITE"
upstream="${version%%+*}"
series="$(echo "$upstream" | cut -d. -f1,2)"
[ "$(printf '%s\n%s\n' "$MIN_RUST" "$series" | sort -V | head -1)" = "$MIN_RUST" ] \
  || die "$SUITE's rustc is $version, older than $MIN_RUST"
log "$SUITE has rustc $version"

# check_std ARCH: sid's std for ARCH is at rustc's exact version (same source upload).
check_std() {
  local arch="$1" std
  index "$arch"
  std="$(field "$arch" libstd-rust-dev Version)"
  [ -n "$std" ] || die "$SUITE has no libstd-rust-dev for $arch"
  [ "$std" = "$version" ] || die "$SUITE's libstd-rust-dev for $arch is $std, not rustc's version $version" \
    "(Debian's $arch build lags: retry once it has caught up, or build without linux/$(platform "$arch"))"
}

# fetch ARCH PACKAGE DIR: downloads PACKAGE for ARCH, checks its SHA256 and unpacks it into
# DIR/root, listing it in DIR/packages.
fetch() {
  local arch="$1" pkg="$2" dir="$3" file sum deb
  file="$(field "$arch" "$pkg" Filename)"
  sum="$(field "$arch" "$pkg" SHA256)"
  [ -n "$file" ] && [ -n "$sum" ] || die "$pkg ($arch) not in $SUITE"
  mkdir -p "$dir/debs" "$dir/root"
  deb="$dir/debs/$(basename "$file")"
  curl -fsSL --retry 3 -o "$deb" "$MIRROR/$file"
  echo "$sum  $deb" | sha256sum -c --quiet - || die "$file: SHA256 mismatch"
  dpkg-deb -x "$deb" "$dir/root"
  echo "$arch $(field "$arch" "$pkg" Version) $file" >>"$dir/packages"
}
target_packages=(libstd-rust-dev "libstd-rust-$series")

# The cached toolchain, when sid still has its rustc: extend it with the missing arches (its
# cross target dir, with the dependencies already built for other arches' host side, stays).
dest="$CACHE/$upstream"
if [ -z "${HPP_CROSS_RUST_REFRESH:-}" ] && [ -f "$dest/.complete" ]; then
  dest="$(cd "$dest" && pwd -P)"
  # A toolchain from before the per-arch markers held arm64's std alone: mark it first.
  if has_std "$dest" arm64; then touch "$dest/.std-arm64"; fi
  for arch in "${arches[@]}"; do
    has_std "$dest" "$arch" && continue
    check_std "$arch"
    start=$SECONDS
    stage="$work/std-$arch"
    for pkg in "${target_packages[@]}"; do fetch "$arch" "$pkg" "$stage"; done
    [ -d "$stage/root/usr/lib/rustlib/$(triple "$arch")/lib" ] || die "the $arch std is not under usr/lib/rustlib"
    cp -a "$stage/root/." "$dest/root/"
    cat "$stage/packages" >>"$dest/packages"
    touch "$dest/.std-markers" "$dest/.std-$arch"
    log "added the $arch std ($(triple "$arch")) to rustc $upstream in $((SECONDS - start)) s"
  done
  ln -sfn "$upstream" "$CACHE/current"
  echo "$dest/bin/rustc"
  exit 0
fi

# A new toolchain: every requested arch, and every arch the previous one had (so that moving to
# a new rustc keeps what was cached).
if [ -f "$CACHE/current/.complete" ]; then
  previous="$(cd "$CACHE/current" && pwd -P)"
  for arch in arm64 ppc64el s390x; do
    if has_std "$previous" "$arch" && [[ " ${arches[*]} " != *" $arch "* ]]; then arches+=("$arch"); fi
  done
fi
for arch in "${arches[@]}"; do check_std "$arch"; done

# The host side: rustc, its std (for build scripts and proc macros) and the runtime it links
# against (resolved from the Depends: of libstd-rust-$series and libllvm, listed here so a new
# dependency shows up as a failed `ld.so --list` below instead of going unnoticed).
llvm="$(field amd64 "libstd-rust-$series" Depends | tr ',' '\n' | grep -o 'libllvm[0-9]*' | head -1)"
[ -n "$llvm" ] || die "cannot tell which libllvm libstd-rust-$series needs"
host_packages=(rustc "libstd-rust-dev" "libstd-rust-$series" "$llvm" libc6 libgcc-s1 libstdc++6
  zlib1g libzstd1 libz3-4 libxml2-16 libffi8 libedit2 libtinfo6 libbsd0 libmd0)

rm -rf "$dest.partial"
mkdir -p "$dest.partial/root" "$dest.partial/debs"
start=$SECONDS
for pkg in "${host_packages[@]}"; do fetch amd64 "$pkg" "$dest.partial"; done
for arch in "${arches[@]}"; do
  for pkg in "${target_packages[@]}"; do fetch "$arch" "$pkg" "$dest.partial"; done
done
rm -rf "$dest.partial/debs"
log "downloaded and unpacked $(wc -l <"$dest.partial/packages") packages in $((SECONDS - start)) s"

root="$dest.partial/root"
loader=""
for candidate in usr/lib64/ld-linux-x86-64.so.2 lib64/ld-linux-x86-64.so.2; do
  [ -e "$root/$candidate" ] && { loader="$candidate"; break; }
done
[ -n "$loader" ] || die "no ld-linux-x86-64.so.2 in sid's libc6"
for arch in "${arches[@]}"; do
  [ -d "$root/usr/lib/rustlib/$(triple "$arch")/lib" ] || die "the $arch std is not under usr/lib/rustlib"
done

mkdir -p "$dest.partial/bin"
cat >"$dest.partial/bin/rustc" <<WRAPPER
#!/bin/sh
# sid's rustc $version through sid's loader and libraries (hack/fetch-cross-rust.sh).
root="\$(cd "\$(dirname "\$0")/../root" && pwd -P)"
exec "\$root/$loader" --library-path "\$root/usr/lib/x86_64-linux-gnu:\$root/lib/x86_64-linux-gnu" \\
  "\$root/usr/bin/rustc" --sysroot "\$root/usr" "\$@"
WRAPPER
chmod +x "$dest.partial/bin/rustc"

# Every library resolves from the cache, and the compiler runs.
if "$root/$loader" --library-path "$root/usr/lib/x86_64-linux-gnu" --list "$root/usr/bin/rustc" | grep -q 'not found'; then
  "$root/$loader" --library-path "$root/usr/lib/x86_64-linux-gnu" --list "$root/usr/bin/rustc" >&2
  die "sid's rustc needs a library this script does not fetch"
fi
"$dest.partial/bin/rustc" -vV >&2 || die "sid's rustc does not run here"

touch "$dest.partial/.std-markers"
for arch in "${arches[@]}"; do touch "$dest.partial/.std-$arch"; done
touch "$dest.partial/.complete"
rm -rf "$dest"
mv "$dest.partial" "$dest"
ln -sfn "$upstream" "$CACHE/current"
echo "$dest/bin/rustc"
