#!/usr/bin/env bash
# Unpacks the kubevirt hostpath-provisioner-operator's source (the operator most KubeVirt clusters
# run today, which this project's operator takes over) for the tests that migrate from it: its
# deploy/ files (operator.yaml with its CRD, RBAC and Deployment; the example resources) are
# applied as its README says. The archive is the upstream tree at commit 03d4d6711f6a with its
# vendor/ directory, unchanged; no registry this project reaches serves it, so it is given by
# path:
#
#   HPP_KUBEVIRT_OPERATOR_ARCHIVE=/path/to/kubevirt-hostpath-provisioner-operator-03d4d671.tar.gz \
#     hack/kubevirt-operator-source.sh
#
# The archive must have the pinned sha256 below. The tree is cached by that hash outside the
# repository, like the control plane. Prints the tree's directory on its last line.
set -euo pipefail

PINNED_SHA256="9dd64c5efaa860f4d6e78471962c0efeae699d41a5698f713411686c21dbe02b"
CACHE_ROOT="${HPP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/hostpath-provisioner}"
OUT="$CACHE_ROOT/kubevirt-operator/$PINNED_SHA256"
# One run at a time: `make test` and hack/build-lane-tools.sh (beside it under .ci/run) may ask at
# once, and the build directory below is one for both.
mkdir -p "$CACHE_ROOT"
exec 7>"$CACHE_ROOT/.kubevirt-operator.lock"
flock 7

log() { printf '[kubevirt-operator] %s\n' "$*" >&2; }
die() { printf '[kubevirt-operator] error: %s\n' "$*" >&2; exit 1; }

if [ -f "$OUT/src/deploy/operator.yaml" ]; then
  log "source (sha256 ${PINNED_SHA256:0:12}) cached"
  echo "$OUT/src"
  exit 0
fi

archive="${HPP_KUBEVIRT_OPERATOR_ARCHIVE:-}"
[ -n "$archive" ] || die "HPP_KUBEVIRT_OPERATOR_ARCHIVE is not set: give the path of kubevirt-hostpath-provisioner-operator-03d4d671.tar.gz"
[ -f "$archive" ] || die "$archive: no such file"
actual="$(sha256sum "$archive" | cut -d' ' -f1)"
[ "$actual" = "$PINNED_SHA256" ] || die "$archive has sha256 $actual, not the pinned $PINNED_SHA256"

work="$CACHE_ROOT/build/kubevirt-operator-$PINNED_SHA256"
rm -rf "$work"
mkdir -p "$work"
tar -xzf "$archive" -C "$work"
# The archive holds one top directory, hostpath-provisioner-operator/.
top="$(find "$work" -mindepth 1 -maxdepth 1 -type d | head -n 1)"
[ -f "$top/deploy/operator.yaml" ] || die "no deploy/operator.yaml in $archive"
mv "$top" "$work/src"
mkdir -p "$(dirname "$OUT")"
rm -rf "$OUT"
mv "$work" "$OUT"
log "unpacked into $OUT/src"
echo "$OUT/src"
