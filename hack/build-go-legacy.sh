#!/usr/bin/env bash
# Builds the Go provisioner this project replaces (kubevirt/hostpath-provisioner, cmd/provisioner)
# from its source archive, for the real-node lane's swap test (tests/real_nodes/swap.rs) and for
# comparisons. The archive is the upstream tree at commit 7c1422556950 with its vendor/ directory,
# unchanged; the Go module proxy does not serve that module, so it is given by path:
#
#   HPP_GO_LEGACY_ARCHIVE=/path/to/kubevirt-hostpath-provisioner-7c142255.tar.gz hack/build-go-legacy.sh
#
# The archive must have the pinned sha256 below. The tree and the static binary are cached by
# that hash outside the repository, like the control plane. Prints the cache directory on its
# last line: `kubevirt-legacy-provisioner` (the binary) and `src/` (the tree, with its deploy/).
set -euo pipefail

PINNED_SHA256="e1d29651a215d38a078f5722aed55265de49888fe045bf772df5ca928a2e9c84"
CACHE_ROOT="${HPP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/hostpath-provisioner}"
OUT="$CACHE_ROOT/go-legacy/$PINNED_SHA256"
# One run at a time: `make test` and hack/build-lane-tools.sh (beside it under .ci/run) may ask at
# once, and the build directory below is one for both.
mkdir -p "$CACHE_ROOT"
exec 8>"$CACHE_ROOT/.go-legacy.lock"
flock 8

log() { printf '[go-legacy] %s\n' "$*" >&2; }
die() { printf '[go-legacy] error: %s\n' "$*" >&2; exit 1; }

if [ -x "$OUT/kubevirt-legacy-provisioner" ] && [ -f "$OUT/src/deploy/kubevirt-hostpath-provisioner.yaml" ]; then
  log "Go provisioner (source sha256 ${PINNED_SHA256:0:12}) cached"
  echo "$OUT"
  exit 0
fi

archive="${HPP_GO_LEGACY_ARCHIVE:-}"
[ -n "$archive" ] || die "HPP_GO_LEGACY_ARCHIVE is not set: give the path of kubevirt-hostpath-provisioner-7c142255.tar.gz"
[ -f "$archive" ] || die "$archive: no such file"
actual="$(sha256sum "$archive" | cut -d' ' -f1)"
[ "$actual" = "$PINNED_SHA256" ] || die "$archive has sha256 $actual, not the pinned $PINNED_SHA256"
command -v go >/dev/null 2>&1 || die "Go is not installed; install it from your distribution or go.dev"

work="$CACHE_ROOT/build/go-legacy-$PINNED_SHA256"
rm -rf "$work"
mkdir -p "$work/src"
tar -xzf "$archive" -C "$work/src"
log "compiling cmd/provisioner offline from vendor/ (about a minute on 2 cores)"
start=$SECONDS
(cd "$work/src" && CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-mod=vendor go build -o "$work/kubevirt-legacy-provisioner" ./cmd/provisioner >&2) \
  || die "go build of cmd/provisioner failed"
log "built in $((SECONDS - start)) s"
mkdir -p "$(dirname "$OUT")"
rm -rf "$OUT"
mv "$work" "$OUT"
echo "$OUT"
