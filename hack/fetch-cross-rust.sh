#!/usr/bin/env bash
# Fetches Debian sid's Rust toolchain for cross-compiling the provisioner to linux/arm64
# (aarch64-unknown-linux-gnu) and prints the path of a `rustc` cargo can use (RUSTC=...).
#
# Why sid: the crate needs Rust >= 1.88 and an aarch64 standard library. rustup's server is not
# reachable from the machines this project builds on, and bookworm's rustc is too old; sid
# (deb.debian.org) ships a current rustc for amd64 and libstd-rust-dev for arm64. No prebuilt
# toolchain archive is downloaded: only Debian packages, checked end to end (InRelease signed by
# a key in the host's debian-archive-keyring -> Packages.xz sha256 -> each .deb's SHA256) and
# unpacked with `dpkg-deb -x` (nothing is installed) into
#   ${HPP_CACHE_DIR:-~/.cache/hostpath-provisioner}/cross-rust/<rustc version>/
#
# sid's rustc needs a newer glibc (>= 2.39), libstdc++ and libllvm than bookworm has, so sid's
# own runtime libraries (libc6, libstdc++6, libllvm22 and their dependencies) are unpacked too,
# and the printed `bin/rustc` is a wrapper that starts sid's rustc through sid's dynamic loader
# with --library-path (no LD_LIBRARY_PATH: the linker and build scripts rustc starts run with the
# host's libraries). The target's C code (ring) and the link use the host's
# gcc-aarch64-linux-gnu and libc6-dev-arm64-cross.
#
# A complete toolchain already in the cache is reused without any network access
# (HPP_CROSS_RUST_REFRESH=1 checks sid again).
set -euo pipefail

MIRROR="${HPP_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
SUITE="${HPP_CROSS_RUST_SUITE:-sid}"
KEYRING="${HPP_DEBIAN_KEYRING:-/usr/share/keyrings/debian-archive-keyring.gpg}"
CACHE="${HPP_CACHE_DIR:-$HOME/.cache/hostpath-provisioner}/cross-rust"
MIN_RUST="1.88"

log() { echo "fetch-cross-rust: $*" >&2; }
die() { log "$*"; exit 1; }

if [ -z "${HPP_CROSS_RUST_REFRESH:-}" ] && [ -f "$CACHE/current/.complete" ]; then
  echo "$(cd "$CACHE/current" && pwd -P)/bin/rustc"
  exit 0
fi

for tool in curl xz dpkg-deb sha256sum gpgv awk; do
  command -v "$tool" >/dev/null || die "$tool not found"
done
[ -f "$KEYRING" ] || die "$KEYRING not found (apt-get install debian-archive-keyring)"

mkdir -p "$CACHE"
work="$(mktemp -d "$CACHE/.fetch.XXXXXX")"
trap 'rm -rf "$work"' EXIT

log "checking $MIRROR/dists/$SUITE/InRelease"
curl -fsSL --retry 3 -o "$work/InRelease" "$MIRROR/dists/$SUITE/InRelease"
gpgv --keyring "$KEYRING" --output "$work/Release" "$work/InRelease" 2>"$work/gpgv.log" \
  || { cat "$work/gpgv.log" >&2; die "InRelease of $SUITE is not signed by a key in $KEYRING"; }

# index ARCH: the suite's main Packages for ARCH, its sha256 checked against Release.
index() {
  local arch="$1" path="main/binary-$1/Packages.xz" want
  want="$(awk -v p="$path" '/^SHA256:/{s=1;next} /^[^ ]/{s=0} s && $3==p {print $1}' "$work/Release")"
  [ -n "$want" ] || die "Release lists no $path"
  curl -fsSL --retry 3 -o "$work/Packages-$arch.xz" "$MIRROR/dists/$SUITE/$path"
  echo "$want  $work/Packages-$arch.xz" | sha256sum -c --quiet - || die "$path: sha256 mismatch"
  xz -dc "$work/Packages-$arch.xz" >"$work/Packages-$arch"
}
index amd64
index arm64

# field ARCH PACKAGE FIELD: one field of PACKAGE's (first) stanza.
field() {
  awk -v pkg="$2" -v f="$3" '
    /^Package: /{cur=$2} /^$/{if(done)exit; cur=""}
    cur==pkg && index($0, f": ")==1 {print substr($0, length(f)+3); done=1}
  ' "$work/Packages-$1"
}

version="$(field amd64 rustc Version)"
[ -n "$version" ] || die "no rustc in $SUITE"
upstream="${version%%+*}"
series="$(echo "$upstream" | cut -d. -f1,2)"
[ "$(printf '%s\n%s\n' "$MIN_RUST" "$series" | sort -V | head -1)" = "$MIN_RUST" ] \
  || die "$SUITE's rustc is $version, older than $MIN_RUST"
[ "$(field arm64 libstd-rust-dev Version)" = "$version" ] \
  || die "$SUITE's libstd-rust-dev for arm64 is not at rustc's version $version"
log "$SUITE has rustc $version"

# The host side: rustc, its std (for build scripts and proc macros) and the runtime it links
# against (resolved from the Depends: of libstd-rust-$series and libllvm, listed here so a new
# dependency shows up as a failed `ld.so --list` below instead of going unnoticed).
llvm="$(field amd64 "libstd-rust-$series" Depends | tr ',' '\n' | grep -o 'libllvm[0-9]*' | head -1)"
[ -n "$llvm" ] || die "cannot tell which libllvm libstd-rust-$series needs"
host_packages=(rustc "libstd-rust-dev" "libstd-rust-$series" "$llvm" libc6 libgcc-s1 libstdc++6
  zlib1g libzstd1 libz3-4 libxml2-16 libffi8 libedit2 libtinfo6 libbsd0 libmd0)
target_packages=(libstd-rust-dev "libstd-rust-$series")

dest="$CACHE/$upstream"
rm -rf "$dest.partial"
mkdir -p "$dest.partial/root" "$dest.partial/debs"

fetch() {
  local arch="$1" pkg="$2" file sum deb
  file="$(field "$arch" "$pkg" Filename)"
  sum="$(field "$arch" "$pkg" SHA256)"
  [ -n "$file" ] && [ -n "$sum" ] || die "$pkg ($arch) not in $SUITE"
  deb="$dest.partial/debs/$(basename "$file")"
  curl -fsSL --retry 3 -o "$deb" "$MIRROR/$file"
  echo "$sum  $deb" | sha256sum -c --quiet - || die "$file: SHA256 mismatch"
  dpkg-deb -x "$deb" "$dest.partial/root"
  echo "$arch $(field "$arch" "$pkg" Version) $file" >>"$dest.partial/packages"
}
start=$SECONDS
for pkg in "${host_packages[@]}"; do fetch amd64 "$pkg"; done
for pkg in "${target_packages[@]}"; do fetch arm64 "$pkg"; done
rm -rf "$dest.partial/debs"
log "downloaded and unpacked $(wc -l <"$dest.partial/packages") packages in $((SECONDS - start)) s"

root="$dest.partial/root"
loader=""
for candidate in usr/lib64/ld-linux-x86-64.so.2 lib64/ld-linux-x86-64.so.2; do
  [ -e "$root/$candidate" ] && { loader="$candidate"; break; }
done
[ -n "$loader" ] || die "no ld-linux-x86-64.so.2 in sid's libc6"
[ -d "$root/usr/lib/rustlib/aarch64-unknown-linux-gnu/lib" ] || die "the arm64 std is not under usr/lib/rustlib"

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

touch "$dest.partial/.complete"
rm -rf "$dest"
mv "$dest.partial" "$dest"
ln -sfn "$upstream" "$CACHE/current"
echo "$dest/bin/rustc"
