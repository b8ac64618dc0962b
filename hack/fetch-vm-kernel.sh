#!/usr/bin/env bash
# Fetches a Debian kernel for the project-quota VM test (tests/vm_project_quota.rs) and caches it
# by package version outside the repository. The host kernel may lack XFS quota and the ext4
# quota format (CONFIG_XFS_QUOTA, CONFIG_QFMT_V2); Debian's generic kernel has both as modules.
#
# The package is downloaded with `apt-get download` and unpacked with `dpkg-deb -x`, never
# installed: no bootloader or initramfs hooks run and the host's /boot is left alone. Installs
# qemu-system-x86 and busybox-static (the guest's init and tools) when missing.
# Prints the directory holding boot/vmlinuz-*, boot/config-* and lib/modules/ on its last line.
set -euo pipefail

META_PACKAGE="${HPP_VM_KERNEL_PACKAGE:-linux-image-amd64}"
CACHE_ROOT="${HPP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/hostpath-provisioner}"
VM_CACHE="$CACHE_ROOT/vm"

log() { printf '[vm-kernel] %s\n' "$*" >&2; }
die() { printf '[vm-kernel] error: %s\n' "$*" >&2; exit 1; }

apt_updated=false
apt_update() {
  if ! $apt_updated; then
    apt-get update -qq >&2 || die "apt-get update failed; is the Debian mirror reachable?"
    apt_updated=true
  fi
}

missing=()
command -v qemu-system-x86_64 >/dev/null 2>&1 || missing+=(qemu-system-x86)
# The guest's init needs a static busybox (Debian's busybox package is dynamic).
case "$(ldd /bin/busybox 2>&1 || true)" in
  *"not a dynamic executable"*) ;;
  *) missing+=(busybox-static) ;;
esac
if [ "${#missing[@]}" -gt 0 ]; then
  [ "$(id -u)" -eq 0 ] || die "${missing[*]} missing and not root: install them with apt-get"
  log "installing ${missing[*]}"
  apt_update
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2 \
    || die "could not install ${missing[*]}"
fi

# The concrete image package the meta package points at (linux-image-6.1.0-NN-amd64), and the
# version apt would take.
resolve() {
  package="$(apt-cache depends "$META_PACKAGE" 2>/dev/null | awk '/Depends: linux-image-/{print $2; exit}')"
  [ -n "$package" ] || return 1
  version="$(apt-cache policy "$package" 2>/dev/null | awk '/Candidate:/{print $2; exit}')"
  [ -n "$version" ] && [ "$version" != "(none)" ]
}
if ! resolve; then
  apt_update
  resolve || {
    # No package lists and no mirror: any kernel cached before still does the job.
    cached="$(ls -d "$VM_CACHE"/*/.complete 2>/dev/null | sort -V | tail -n1 || true)"
    [ -n "$cached" ] || die "apt cannot resolve $META_PACKAGE and nothing is cached under $VM_CACHE"
    log "apt cannot resolve $META_PACKAGE; using the cached $(dirname "$cached")"
    dirname "$cached"
    exit 0
  }
fi

DIR="$VM_CACHE/$package-$version"
# One download at a time: a second run waits, then finds the first one's result.
mkdir -p "$VM_CACHE"
exec 9>"$VM_CACHE/.lock"
flock 9
if [ -f "$DIR/.complete" ]; then
  log "$package $version cached"
  echo "$DIR"
  exit 0
fi

# Under the lock no other download runs: leftovers of a killed one can go.
rm -rf "$VM_CACHE"/.partial.*
log "downloading $package $version"
start=$SECONDS
WORK="$(mktemp -d "$VM_CACHE/.partial.XXXXXX")"
# apt downloads as its sandbox user when it can read the directory.
chmod 755 "$WORK"
trap 'rm -rf "$WORK"' EXIT
(cd "$WORK" && apt-get download -qq "$package=$version" >&2) || die "apt-get download $package=$version failed"
deb="$(ls "$WORK"/*.deb)"
mkdir -p "$WORK/root"
dpkg-deb -x "$deb" "$WORK/root"
rm -f "$deb"
ls "$WORK"/root/boot/vmlinuz-* >/dev/null 2>&1 || die "$package carries no /boot/vmlinuz-*"
touch "$WORK/root/.complete"
rm -rf "$DIR"
mv "$WORK/root" "$DIR"
log "$package $version unpacked in $((SECONDS - start)) s"
# Older kernels (400 MB each unpacked) are replaced, not kept.
for old in "$VM_CACHE"/*/; do
  [ "${old%/}" = "$DIR" ] || { log "removing the older ${old%/}"; rm -rf "${old%/}"; }
done
echo "$DIR"
