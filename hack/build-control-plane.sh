#!/usr/bin/env bash
# Builds the pinned Kubernetes control-plane binaries (kube-apiserver, kube-controller-manager,
# kube-scheduler, etcd, kubectl for rendering and applying deploy/, and the kubelet for the real-node
# lane) from the Go module proxy and caches them by version outside the repository. The kubelet
# shares all but ~100 of its packages with the control plane, so it is built in the same `go build`.
# Rebuilds only what is missing. Prints the bin directory on its last line.
#
# Why a wrapper module: k8s.io/kubernetes lists its staging modules at v0.0.0 with replace
# directives, so `go install k8s.io/kubernetes/cmd/...@vX` cannot work (see
# docs/testing.md).
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-v1.36.3}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
CACHE_ROOT="${HPP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/hostpath-provisioner}"
BIN="$CACHE_ROOT/k8s/$K8S_VERSION-etcd-$ETCD_VERSION/bin"
WORK="$CACHE_ROOT/build"

log() { printf '[control-plane] %s\n' "$*" >&2; }
die() { printf '[control-plane] error: %s\n' "$*" >&2; exit 1; }

command -v go >/dev/null 2>&1 || die "Go is not installed (need Go >= 1.26 for Kubernetes ${K8S_VERSION}); install it from your distribution or go.dev"
GO_MINOR="$(go env GOVERSION | sed -E 's/^go1\.([0-9]+).*/\1/')"
[ "${GO_MINOR:-0}" -ge 26 ] || die "Go $(go env GOVERSION) is too old: Kubernetes ${K8S_VERSION} needs Go >= 1.26"

mkdir -p "$BIN" "$WORK"

have() { # have <binary> <expected version substring>
  local flag=--version
  [ "$1" = kubectl ] && flag="version --client"
  # shellcheck disable=SC2086 # flag is two words for kubectl
  [ -x "$BIN/$1" ] && "$BIN/$1" $flag 2>/dev/null | grep -q -- "$2"
}

K8S_MINOR="$(echo "$K8S_VERSION" | cut -d. -f2)"
STAGING_VERSION="v0.${K8S_MINOR}.$(echo "$K8S_VERSION" | cut -d. -f3)"
STAGING="api apiextensions-apiserver apimachinery apiserver cli-runtime client-go cloud-provider
cluster-bootstrap code-generator component-base component-helpers controller-manager cri-api
cri-client cri-streaming csi-translation-lib dynamic-resource-allocation endpointslice externaljwt
kms kube-aggregator kube-controller-manager kube-proxy kube-scheduler kubectl kubelet metrics
mount-utils pod-security-admission sample-apiserver sample-cli-plugin sample-controller streaming"

build_kubernetes() { # build_kubernetes <command>...
  local dir="$WORK/k8s-$K8S_VERSION"
  mkdir -p "$dir"
  {
    echo "module local/k8s-testbin"
    echo "go 1.26.0"
    echo "godebug default=go1.26"
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo "replace ("
    for m in $STAGING; do echo "  k8s.io/$m => k8s.io/$m $STAGING_VERSION"; done
    echo ")"
  } > "$dir/go.mod"
  cat > "$dir/tools.go" <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
GO
  log "resolving k8s.io/kubernetes $K8S_VERSION modules (module proxy: $(go env GOPROXY))"
  (cd "$dir" && GOTOOLCHAIN=local GOFLAGS=-mod=mod go mod tidy -e >&2) \
    || die "could not download Kubernetes modules; is the Go module proxy reachable?"
  local commit date ldflags=""
  commit="$(cd "$dir" && go list -m -f '{{.Version}}' k8s.io/kubernetes)"
  date="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$K8S_MINOR"
    ldflags+=" -X $pkg.gitCommit=$commit -X $pkg.gitTreeState=clean -X $pkg.buildDate=$date"
  done
  local pkgs=()
  for cmd in "$@"; do pkgs+=("k8s.io/kubernetes/cmd/$cmd"); done
  log "compiling $* $K8S_VERSION (cold: 10-30 min on 2 cores)"
  local start=$SECONDS
  (cd "$dir" && CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-mod=mod go build -v -trimpath \
      -tags selinux,notest,grpcnotrace -ldflags "-s -w $ldflags" -o "$BIN/" "${pkgs[@]}" 2>&1 | awk '{n++; if (n % 200 == 0) printf "[control-plane] ... %d packages compiled (%s)\n", n, $0 > "/dev/stderr"}') \
    || die "building Kubernetes failed"
  for cmd in "$@"; do [ -x "$BIN/$cmd" ] || die "building Kubernetes failed (no $cmd produced)"; done
  log "Kubernetes built in $((SECONDS - start)) s"
}

build_etcd() {
  local dir="$WORK/etcd-$ETCD_VERSION"
  mkdir -p "$dir"
  printf 'module local/etcd-testbin\ngo 1.26.0\nrequire go.etcd.io/etcd/server/v3 %s\n' "$ETCD_VERSION" > "$dir/go.mod"
  printf '//go:build tools\n\npackage tools\n\nimport _ "go.etcd.io/etcd/server/v3"\n' > "$dir/tools.go"
  log "resolving etcd $ETCD_VERSION"
  (cd "$dir" && GOTOOLCHAIN=local GOFLAGS=-mod=mod go mod tidy -e >&2) \
    || die "could not download etcd modules; is the Go module proxy reachable?"
  log "compiling etcd $ETCD_VERSION"
  (cd "$dir" && CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-mod=mod go build -trimpath \
      -ldflags "-s -w" -o "$BIN/etcd" go.etcd.io/etcd/server/v3 >&2) || die "building etcd failed"
}

if have etcd "${ETCD_VERSION#v}"; then log "etcd $ETCD_VERSION cached"; else build_etcd; fi
missing=()
for cmd in kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet; do
  if have "$cmd" "$K8S_VERSION"; then log "$cmd $K8S_VERSION cached"; else missing+=("$cmd"); fi
done
[ "${#missing[@]}" -eq 0 ] || build_kubernetes "${missing[@]}"
for b in etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet; do
  [ -x "$BIN/$b" ] || die "$b missing after build"
done
echo "$BIN"
