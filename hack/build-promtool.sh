#!/usr/bin/env bash
# Builds the pinned `promtool` (Prometheus's rule checker and rule unit-test runner) from the Go
# module proxy and caches it by version outside the repository, like the control plane. The
# alerting rules in deploy/helm/hostpath-provisioner/files/alerts.rules.yaml are checked and
# unit-tested with it (tests/alert_rules.rs). Prints the binary's path on its last line.
#
# The module github.com/prometheus/prometheus tags Prometheus 3.x as v0.3xx.y (v0.316.0 is
# Prometheus 3.16.0).
set -euo pipefail

PROMETHEUS_MODULE_VERSION="${PROMETHEUS_MODULE_VERSION:-v0.316.0}"
CACHE_ROOT="${HPP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/hostpath-provisioner}"
BIN="$CACHE_ROOT/promtool/$PROMETHEUS_MODULE_VERSION/bin"
WORK="$CACHE_ROOT/build/promtool-$PROMETHEUS_MODULE_VERSION"

log() { printf '[promtool] %s\n' "$*" >&2; }
die() { printf '[promtool] error: %s\n' "$*" >&2; exit 1; }

if [ -x "$BIN/promtool" ] && "$BIN/promtool" --version >/dev/null 2>&1; then
  log "promtool $PROMETHEUS_MODULE_VERSION cached"
  echo "$BIN/promtool"
  exit 0
fi

command -v go >/dev/null 2>&1 || die "Go is not installed; install it from your distribution or go.dev"
mkdir -p "$BIN" "$WORK"
# A wrapper module pins the version; `go build -mod=mod` below resolves and downloads only the
# modules promtool's packages need, through the module proxy.
printf 'module local/promtool-bin\ngo 1.26.0\nrequire github.com/prometheus/prometheus %s\n' \
  "$PROMETHEUS_MODULE_VERSION" > "$WORK/go.mod"
log "resolving github.com/prometheus/prometheus $PROMETHEUS_MODULE_VERSION (module proxy: $(go env GOPROXY))"
(cd "$WORK" && GOTOOLCHAIN=local go mod download github.com/prometheus/prometheus >&2) \
  || die "could not download the Prometheus module; is the Go module proxy reachable?"
# 0.316.0 -> 3.16.0, for `promtool --version`.
minor="$(echo "$PROMETHEUS_MODULE_VERSION" | sed -E 's/^v0\.3([0-9]+)\.([0-9]+).*/\1/')"
patch="$(echo "$PROMETHEUS_MODULE_VERSION" | sed -E 's/^v0\.3([0-9]+)\.([0-9]+).*/\2/')"
version="3.$((10#$minor)).$patch"
log "compiling promtool $version (cold: a few minutes on 2 cores)"
start=$SECONDS
# remove_all_sd leaves out Prometheus's service-discovery plugins (the cloud SDKs): promtool's
# rule checks and rule unit tests do not use them, and they are over half of its build (measured
# on 2 cores with an empty build cache: 169 s with the tag, 362 s without).
(cd "$WORK" && CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-mod=mod go build -trimpath -tags remove_all_sd \
    -ldflags "-s -w -X github.com/prometheus/common/version.Version=$version" \
    -o "$BIN/promtool" github.com/prometheus/prometheus/cmd/promtool >&2) || die "building promtool failed"
"$BIN/promtool" --version >/dev/null 2>&1 || die "the built promtool does not run"
log "promtool built in $((SECONDS - start)) s"
echo "$BIN/promtool"
