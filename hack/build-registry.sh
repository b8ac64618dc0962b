#!/usr/bin/env bash
# Builds the pinned CNCF distribution registry (`registry`, the reference OCI registry) from the
# Go module proxy and caches it by version outside the repository, like the control plane. The
# publish tests (tests/e2e_registry.rs) start it on localhost with TLS and push the image and the
# chart to it as docs/install.md and docs/development.md write. Prints the binary's path on its
# last line.
set -euo pipefail

DISTRIBUTION_VERSION="${DISTRIBUTION_VERSION:-v3.1.2}"
CACHE_ROOT="${HPP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/hostpath-provisioner}"
BIN="$CACHE_ROOT/registry/$DISTRIBUTION_VERSION/bin"
WORK="$CACHE_ROOT/build/registry-$DISTRIBUTION_VERSION"

log() { printf '[registry] %s\n' "$*" >&2; }
die() { printf '[registry] error: %s\n' "$*" >&2; exit 1; }

if [ -x "$BIN/registry" ] && "$BIN/registry" --version >/dev/null 2>&1; then
  log "registry $DISTRIBUTION_VERSION cached"
  echo "$BIN/registry"
  exit 0
fi

command -v go >/dev/null 2>&1 || die "Go is not installed; install it from your distribution or go.dev"
mkdir -p "$BIN" "$WORK"
# A wrapper module pins the version; `go build -mod=mod` resolves only what the command needs.
printf 'module local/registry-bin\ngo 1.26.0\nrequire github.com/distribution/distribution/v3 %s\n' \
  "$DISTRIBUTION_VERSION" > "$WORK/go.mod"
log "resolving github.com/distribution/distribution/v3 $DISTRIBUTION_VERSION (module proxy: $(go env GOPROXY))"
(cd "$WORK" && GOTOOLCHAIN=local go mod download github.com/distribution/distribution/v3 >&2) \
  || die "could not download the distribution module; is the Go module proxy reachable?"
log "compiling registry (cold: a minute or two on 2 cores)"
start=$SECONDS
(cd "$WORK" && CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-mod=mod go build -trimpath \
    -ldflags "-s -w -X github.com/distribution/distribution/v3/version.version=$DISTRIBUTION_VERSION" \
    -o "$BIN/registry" github.com/distribution/distribution/v3/cmd/registry >&2) || die "building the registry failed"
"$BIN/registry" --version >/dev/null 2>&1 || die "the built registry does not run"
log "registry built in $((SECONDS - start)) s"
echo "$BIN/registry"
