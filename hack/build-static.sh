#!/usr/bin/env bash
# Builds the provisioner as one static executable, the way every image of it is built: the
# Dockerfile's build stage and `make image` (tests/testbed, for linux/amd64, linux/arm64,
# linux/ppc64le and linux/s390x) both run this script, so the image users build and the image the
# tests run link the same libc.
#
# Usage: hack/build-static.sh TARGET PROFILE TARGET_DIR
#   TARGET      a *-unknown-linux-gnu triple: glibc, linked in with +crt-static. The provisioner
#               tunes glibc's malloc (src/serving/heap.rs), and every memory figure in the docs is
#               measured on glibc, so the images use it too (no musl build).
#   PROFILE     a Cargo profile: `release` for the Dockerfile, `image` for the tests (Cargo.toml)
#   TARGET_DIR  Cargo's target directory
# Prints the built binary's path. Extra Cargo settings come from the environment (RUSTC,
# CARGO_TARGET_<TRIPLE>_LINKER and CC_<triple> for a cross build; HPP_GIT_COMMIT, see build.rs).
set -euo pipefail

if [ "$#" -ne 3 ]; then
  echo "usage: $0 TARGET PROFILE TARGET_DIR" >&2
  exit 2
fi
target="$1" profile="$2" target_dir="$3"
case "$target" in
  *-unknown-linux-gnu) ;;
  *) echo "$0: $target is not a *-unknown-linux-gnu target: the images link glibc statically" >&2; exit 2 ;;
esac

cd "$(dirname "$0")/.."
# --target keeps +crt-static off build scripts and proc macros, which must stay dynamic.
flags="-C target-feature=+crt-static"
# Profiles that abort on panic (Cargo.toml) need no unwinding tables: the binary is stripped, so
# they would not even name a frame. `dev` unwinds and keeps them.
[ "$profile" = dev ] || flags="$flags -C force-unwind-tables=no"
RUSTFLAGS="$flags" "${CARGO:-cargo}" build --locked -p hostpath-provisioner \
  --profile "$profile" --target "$target" --target-dir "$target_dir" >&2
# Cargo names the `dev` profile's directory `debug`; every other profile by its own name.
[ "$profile" = dev ] && profile=debug
echo "$target_dir/$target/$profile/hostpath-provisioner"
