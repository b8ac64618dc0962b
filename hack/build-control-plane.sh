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
  [ -x "$BIN/$1" ] || return 1
  # Captured first: piped into `grep -q`, which exits at the first match, kubectl (a line after its
  # version) could die of SIGPIPE and pipefail would call a cached binary missing (seen: kubectl
  # recompiled at the start of two runs of the oldest-Kubernetes lane).
  local out
  # shellcheck disable=SC2086 # flag is two words for kubectl
  out="$("$BIN/$1" $flag 2>/dev/null)" || return 1
  grep -q -- "$2" <<<"$out"
}

K8S_MINOR="$(echo "$K8S_VERSION" | cut -d. -f2)"
STAGING_VERSION="v0.${K8S_MINOR}.$(echo "$K8S_VERSION" | cut -d. -f3)"
# The commands to build: all five by default; a lane that needs no kubelet (the oldest-Kubernetes
# lane) sets K8S_COMMANDS to a subset and saves the kubelet's ~100 extra packages.
K8S_COMMANDS="${K8S_COMMANDS:-kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet}"
# A Go toolchain for Kubernetes only (e.g. go1.22.12 for an old release the local Go cannot
# compile); `go` fetches it from the module proxy (golang.org/toolchain). Default: the local Go.
K8S_GOTOOLCHAIN="${K8S_GOTOOLCHAIN:-local}"

# The staging modules (k8s.io/api, client-go, ...) differ by release: k8s.io/kubernetes requires
# them at v0.0.0 with replace directives into ./staging, so read them from its go.mod at the
# requested version and pin each to the matching v0.<minor>.<patch> tag.
kubernetes_gomod() {
  local gomod
  gomod="$(GOTOOLCHAIN=local GOFLAGS=-mod=mod go mod download -json "k8s.io/kubernetes@$K8S_VERSION" \
    | sed -nE 's/^\s*"GoMod": "(.*)",?$/\1/p')"
  [ -f "$gomod" ] || die "could not download the go.mod of k8s.io/kubernetes $K8S_VERSION; is the Go module proxy reachable?"
  echo "$gomod"
}
staging_modules() { # staging_modules <go.mod>
  { sed -nE 's#^[[:space:]]*k8s\.io/([a-z0-9-]+)[[:space:]]+v0\.0\.0[[:space:]]*(//.*)?$#\1#p' "$1"
    sed -nE 's#^[[:space:]]*k8s\.io/([a-z0-9-]+)[[:space:]]+=>[[:space:]]+\./staging/.*$#\1#p' "$1"
  } | sort -u
}

build_kubernetes() { # build_kubernetes <command>...
  local dir="$WORK/k8s-$K8S_VERSION"
  mkdir -p "$dir"
  local gomod staging go_line
  gomod="$(kubernetes_gomod)"
  staging="$(staging_modules "$gomod")"
  [ -n "$staging" ] || die "no staging modules found in $gomod"
  # The Go language version (and so the GODEBUG defaults) Kubernetes itself declares.
  go_line="$(sed -nE 's/^go ([0-9.]+)$/\1/p' "$gomod")"
  {
    echo "module local/k8s-testbin"
    echo "go ${go_line:-1.26.0}"
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo "replace ("
    for m in $staging; do echo "  k8s.io/$m => k8s.io/$m $STAGING_VERSION"; done
    echo ")"
  } > "$dir/go.mod"
  {
    printf '//go:build tools\n\npackage tools\n\nimport (\n'
    for cmd in "$@"; do printf '\t_ "k8s.io/kubernetes/cmd/%s"\n' "$cmd"; done
    printf ')\n'
  } > "$dir/tools.go"
  log "resolving k8s.io/kubernetes $K8S_VERSION modules (module proxy: $(go env GOPROXY))"
  (cd "$dir" && GOTOOLCHAIN="$K8S_GOTOOLCHAIN" GOFLAGS=-mod=mod go mod tidy -e >&2) \
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
  (cd "$dir" && CGO_ENABLED=0 GOTOOLCHAIN="$K8S_GOTOOLCHAIN" GOFLAGS=-mod=mod go build -v -trimpath \
      -tags selinux,notest,grpcnotrace -ldflags "-s -w $ldflags" -o "$BIN/" "${pkgs[@]}" 2>&1 | tee "$dir/build.log" | awk '{n++; if (n % 200 == 0) printf "[control-plane] ... %d packages compiled (%s)\n", n, $0 > "/dev/stderr"}') \
    || { grep -v '^[a-zA-Z0-9._/-]*$' "$dir/build.log" | tail -n 40 >&2; die "building Kubernetes failed (log: $dir/build.log)"; }
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
for cmd in $K8S_COMMANDS; do
  if have "$cmd" "$K8S_VERSION"; then log "$cmd $K8S_VERSION cached"; else missing+=("$cmd"); fi
done
[ "${#missing[@]}" -eq 0 ] || build_kubernetes "${missing[@]}"
for b in etcd $K8S_COMMANDS; do
  [ -x "$BIN/$b" ] || die "$b missing after build"
done
echo "$BIN"
