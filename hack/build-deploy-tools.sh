#!/usr/bin/env bash
# Builds the pinned tools the deploy tests need, from the Go module proxy, and caches them by
# version outside the repository next to the control plane (never downloaded from GitHub):
#   helm        renders, lints and installs deploy/helm/hostpath-provisioner
#   kube-score  checks the rendered manifests against the usual deploy conventions
#   crds        the CustomResourceDefinitions the chart's optional objects need on the test
#               control plane (ServiceMonitor and PrometheusRule from the prometheus-operator
#               module, SecurityContextConstraints from the openshift/api module), copied out of
#               the module zips `go mod download` fetches
# Usage: build-deploy-tools.sh [helm|kube-score|crds]...   (no argument: all three)
# Prints one path per requested item, in order: the binary, or the CRD directory. Builds only
# what is missing; concurrent runs (test binaries in parallel) wait for each other on a lock.
set -euo pipefail

HELM_VERSION="${HELM_VERSION:-v4.3.1}"
KUBE_SCORE_VERSION="${KUBE_SCORE_VERSION:-v1.20.0}"
PROMETHEUS_OPERATOR_VERSION="${PROMETHEUS_OPERATOR_VERSION:-v0.85.0}"
# openshift/api has no release tags on the module proxy; this pseudo-version is its master of
# 2025-10-20 (OpenShift 4.21 development).
OPENSHIFT_API_VERSION="${OPENSHIFT_API_VERSION:-v0.0.0-20251020135558-286504b695bc}"
CACHE_ROOT="${HPP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/hostpath-provisioner}"
WORK="$CACHE_ROOT/build"

log() { printf '[deploy-tools] %s\n' "$*" >&2; }
die() { printf '[deploy-tools] error: %s\n' "$*" >&2; exit 1; }

mkdir -p "$CACHE_ROOT" "$WORK"
exec 9>"$CACHE_ROOT/.deploy-tools.lock"
flock 9

need_go() {
  command -v go >/dev/null 2>&1 || die "Go is not installed; install it from your distribution or go.dev"
}

# go_build <name> <module> <version> <package> <binary path> [ldflags]
go_build() {
  local name="$1" module="$2" version="$3" package="$4" out="$5" ldflags="${6:-}"
  local dir="$WORK/$name-$version"
  need_go
  mkdir -p "$dir" "$(dirname "$out")"
  printf 'module local/%s-bin\ngo 1.26.0\nrequire %s %s\n' "$name" "$module" "$version" > "$dir/go.mod"
  printf '//go:build tools\n\npackage tools\n\nimport _ "%s"\n' "$package" > "$dir/tools.go"
  log "resolving $module $version (module proxy: $(go env GOPROXY))"
  (cd "$dir" && GOTOOLCHAIN=local GOFLAGS=-mod=mod go mod tidy -e >&2) \
    || die "could not download $module; is the Go module proxy reachable?"
  log "compiling $name $version (cold: several minutes on 2 cores)"
  local start=$SECONDS
  (cd "$dir" && CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-mod=mod go build -trimpath \
      -ldflags "-s -w $ldflags" -o "$out" "$package" >&2) || die "building $name failed"
  log "$name built in $((SECONDS - start)) s"
}

helm_bin() {
  local bin="$CACHE_ROOT/helm/$HELM_VERSION/bin/helm"
  if ! { [ -x "$bin" ] && "$bin" version --template '{{.Version}}' 2>/dev/null | grep -qx -- "$HELM_VERSION"; }; then
    local major="${HELM_VERSION%%.*}"
    go_build helm "helm.sh/helm/$major" "$HELM_VERSION" "helm.sh/helm/$major/cmd/helm" "$bin" \
      "-X helm.sh/helm/$major/internal/version.version=$HELM_VERSION"
    "$bin" version --template '{{.Version}}' 2>/dev/null | grep -qx -- "$HELM_VERSION" \
      || die "the built helm does not report $HELM_VERSION"
  fi
  echo "$bin"
}

kube_score_bin() {
  local bin="$CACHE_ROOT/kube-score/$KUBE_SCORE_VERSION/bin/kube-score"
  if ! { [ -x "$bin" ] && "$bin" version 2>/dev/null | grep -q -- "${KUBE_SCORE_VERSION#v}"; }; then
    go_build kube-score github.com/zegl/kube-score "$KUBE_SCORE_VERSION" \
      github.com/zegl/kube-score/cmd/kube-score "$bin" "-X main.version=${KUBE_SCORE_VERSION#v}"
    "$bin" version >/dev/null 2>&1 || die "the built kube-score does not run"
  fi
  echo "$bin"
}

# module_dir <module> <version>: the unpacked module zip in the Go module cache.
module_dir() {
  need_go
  local dir
  dir="$(cd "$WORK" && GOTOOLCHAIN=local go mod download -json "$1@$2" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')"
  [ -n "$dir" ] && [ -d "$dir" ] || die "could not download $1@$2 from the module proxy"
  echo "$dir"
}

crds_dir() {
  local out="$CACHE_ROOT/crds/prometheus-operator-$PROMETHEUS_OPERATOR_VERSION-openshift-api-$OPENSHIFT_API_VERSION"
  if [ ! -f "$out/.complete" ]; then
    local tmp="$out.tmp" src
    rm -rf "$tmp" && mkdir -p "$tmp"
    log "taking the CRDs from github.com/prometheus-operator/prometheus-operator@$PROMETHEUS_OPERATOR_VERSION"
    src="$(module_dir github.com/prometheus-operator/prometheus-operator "$PROMETHEUS_OPERATOR_VERSION")"
    for kind in servicemonitors prometheusrules; do
      cp "$src/example/prometheus-operator-crd/monitoring.coreos.com_$kind.yaml" "$tmp/" \
        || die "the prometheus-operator module lacks the $kind CRD"
    done
    log "taking the SecurityContextConstraints CRD from github.com/openshift/api@$OPENSHIFT_API_VERSION"
    src="$(module_dir github.com/openshift/api "$OPENSHIFT_API_VERSION")"
    cp "$src/security/v1/zz_generated.crd-manifests/0000_03_config-operator_01_securitycontextconstraints.crd.yaml" \
      "$tmp/security.openshift.io_securitycontextconstraints.yaml" \
      || die "the openshift/api module lacks the SecurityContextConstraints CRD"
    chmod -R u+w "$tmp"
    touch "$tmp/.complete"
    rm -rf "$out" && mv "$tmp" "$out"
  fi
  echo "$out"
}

[ "$#" -gt 0 ] || set -- helm kube-score crds
for item in "$@"; do
  case "$item" in
    helm) helm_bin ;;
    kube-score) kube_score_bin ;;
    crds) crds_dir ;;
    *) die "unknown item '$item' (helm, kube-score, crds)" ;;
  esac
done
