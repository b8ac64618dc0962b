#!/usr/bin/env bash
# Builds, from source, the programs that the kubevirt hostpath-provisioner-operator (the operator
# most KubeVirt clusters run, which this project's operator takes over) deploys, so that a
# real-node test can run that operator as a cluster has it, with images made from these static
# binaries (no registry is reached; no image is built here). Into bin/, named as the upstream
# images name them:
#
#   hostpath-provisioner-operator, mounter  the operator archive's ./cmd/manager and ./cmd/mounter
#                                           (its Dockerfile: /usr/bin/, one image, OPERATOR_IMAGE)
#   hostpath-csi-driver                     the Go archive's ./cmd/plugin, the CSI driver
#                                           (Dockerfile.csi: /hostpath-csi-driver)
#   hostpath-provisioner                    the Go archive's ./cmd/provisioner, for a legacy CR
#                                           (Dockerfile.controller: /hostpath-provisioner)
#   csi-provisioner                         external-provisioner from the Go module proxy
#   csi-node-driver-registrar, livenessprobe  only when their source archives are given (below)
#   kubevirt-sidecars                       stand-ins for those two when they are not given,
#                                           from tests/kubevirt-sidecars (Go modules from the
#                                           proxy), in sidecar-standins/<hash of its source>/
#
# and images.tsv beside bin/: each binary's source, its path in the upstream image, how the
# operator starts it, and the operator Deployment's env var that names its image.
#
#   HPP_KUBEVIRT_OPERATOR_ARCHIVE=/path/to/kubevirt-hostpath-provisioner-operator-03d4d671.tar.gz \
#   HPP_GO_LEGACY_ARCHIVE=/path/to/kubevirt-hostpath-provisioner-7c142255.tar.gz \
#   [HPP_NODE_DRIVER_REGISTRAR_ARCHIVE=/path/to/node-driver-registrar-v2.2.0.tar.gz] \
#   [HPP_LIVENESSPROBE_ARCHIVE=/path/to/livenessprobe-v2.3.0.tar.gz] \
#     hack/build-kubevirt-csi.sh
#
# The two kubevirt archives are unpacked (and checked against their pinned sha256) by
# hack/kubevirt-operator-source.sh and hack/build-go-legacy.sh, and built offline from their
# vendor/ directories. The operator's DaemonSet names csi-provisioner v3.4.1 (env
# CSI_SIG_STORAGE_PROVISIONER_IMAGE); the module proxy serves none of v3 or v4, so the nearest
# served release, v5.1.0, is built (its flags are the ones the DaemonSet passes; Topology is GA
# there). The proxy serves no version of node-driver-registrar or livenessprobe (their go.mod has
# no /v2 suffix, so only pseudo-versions exist, and it refuses those too): they are built, offline
# from their vendor/, only from source archives with the pinned sha256 below, each the upstream
# tag as `git archive --format=tar.gz --prefix=NAME/ TAG` (git 2.39) makes it: the versions the
# operator names (NODE_DRIVER_REG_IMAGE v2.2.0, LIVENESS_PROBE_IMAGE v2.3.0). Without them the
# rest is built, with the stand-ins of tests/kubevirt-sidecars in their place (the real-node
# lane's images copy that one program under both names); a later run with them adds them. The
# snapshotter (CSI_SNAPSHOT_IMAGE) runs only under the CR's Snapshotting feature gate: not built.
#
# Everything is cached outside the repository under a key made of the pinned hashes and
# versions; a run that finds what it is asked for prints the directory at once. Prints the cache
# directory (bin/, images.tsv) on its last line. Cold, on 2 cores: about 13 minutes.
set -euo pipefail

OPERATOR_SHA256="9dd64c5efaa860f4d6e78471962c0efeae699d41a5698f713411686c21dbe02b"
LEGACY_SHA256="e1d29651a215d38a078f5722aed55265de49888fe045bf772df5ca928a2e9c84"
PROVISIONER_MODULE="github.com/kubernetes-csi/external-provisioner/v5"
PROVISIONER_VERSION="v5.1.0"
PROVISIONER_SUM="h1:pUwwaJNxBt3BRbZBYqNRvGYnOGNCicBOeLAAayroTwI="
REGISTRAR_VERSION="v2.2.0" # commit bd1ad6268a014dceaa36c71c14a3fc0ad8240b58
REGISTRAR_SHA256="8f0ae50a98187cf582d3abf96685d5548892c5fd3af1f9db524d65c44a7142c4"
LIVENESS_VERSION="v2.3.0" # commit b3ba0807c94a355585fa11a5dc22a7053bbee45e
LIVENESS_SHA256="38afb1d1155100c8d6479d715ca0339bcf5bb096a99eb2e37fc53441d93a3e8c"
RECIPE=1 # bump when the way a binary is built changes

HACK="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE_ROOT="${HPP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/hostpath-provisioner}"
KEY="$(printf '%s\n' "recipe $RECIPE" "operator $OPERATOR_SHA256" "legacy $LEGACY_SHA256" \
  "$PROVISIONER_MODULE $PROVISIONER_VERSION $PROVISIONER_SUM" \
  "node-driver-registrar $REGISTRAR_VERSION $REGISTRAR_SHA256" \
  "livenessprobe $LIVENESS_VERSION $LIVENESS_SHA256" | sha256sum | cut -c1-16)"
OUT="$CACHE_ROOT/kubevirt-csi/$KEY"
# The stand-ins change with their own source only, so they sit in a directory of their own:
# changing them never rebuilds the rest.
STANDIN_SRC="$HACK/../tests/kubevirt-sidecars"
STANDIN_KEY="$(cat "$STANDIN_SRC/go.mod" "$STANDIN_SRC/go.sum" "$STANDIN_SRC/main.go" | sha256sum | cut -c1-16)"
STANDIN="$OUT/sidecar-standins/$STANDIN_KEY/kubevirt-sidecars"
# One run at a time: `make test` and hack/build-lane-tools.sh (beside it under .ci/run) may ask at
# once, and the build directory below is one for both.
mkdir -p "$CACHE_ROOT"
exec 6>"$CACHE_ROOT/.kubevirt-csi.lock"
flock 6

log() { printf '[kubevirt-csi] %s\n' "$*" >&2; }
die() { printf '[kubevirt-csi] error: %s\n' "$*" >&2; exit 1; }

REQUIRED=(hostpath-provisioner-operator mounter hostpath-csi-driver hostpath-provisioner csi-provisioner)
registrar_archive="${HPP_NODE_DRIVER_REGISTRAR_ARCHIVE:-}"
liveness_archive="${HPP_LIVENESSPROBE_ARCHIVE:-}"
wanted=("${REQUIRED[@]}")
[ -z "$registrar_archive" ] || wanted+=(csi-node-driver-registrar)
[ -z "$liveness_archive" ] || wanted+=(livenessprobe)

missing() { # the wanted binaries not yet in $OUT/bin
  local name
  for name in "${wanted[@]}"; do [ -x "$OUT/bin/$name" ] || printf '%s\n' "$name"; done
}

if [ -f "$OUT/images.tsv" ] && [ -z "$(missing)" ] && [ -x "$STANDIN" ]; then
  log "kubevirt operator and CSI binaries (key $KEY) cached"
  echo "$OUT"
  exit 0
fi

command -v go >/dev/null 2>&1 || die "Go is not installed; install it from your distribution or go.dev"
export CGO_ENABLED=0 GOTOOLCHAIN=local
work="$CACHE_ROOT/build/kubevirt-csi-$KEY"
rm -rf "$work"
mkdir -p "$work/bin" "$OUT/bin"
start=$SECONDS

# Each binary is built into $work/bin and then renamed into $OUT/bin, so $OUT/bin only ever
# holds whole binaries and a failed run resumes where it stopped.
keep() { mv "$work/bin/$1" "$OUT/bin/$1"; log "$1: $(du -h "$OUT/bin/$1" | cut -f1)"; }
need() { [ ! -x "$OUT/bin/$1" ]; }

check_archive() { # VAR PATH SHA256
  [ -f "$2" ] || die "$1=$2: no such file"
  local actual
  actual="$(sha256sum "$2" | cut -d' ' -f1)"
  [ "$actual" = "$3" ] || die "$2 has sha256 $actual, not the pinned $3"
}

# The operator and its mounter: one image (Dockerfile: /usr/bin/hostpath-provisioner-operator,
# /usr/bin/mounter).
if need hostpath-provisioner-operator || need mounter; then
  src="$("$HACK/kubevirt-operator-source.sh" | tail -n 1)"
  log "compiling the operator's cmd/manager and cmd/mounter offline from vendor/"
  for pair in manager:hostpath-provisioner-operator mounter:mounter; do
    (cd "$src" && GOFLAGS="-mod=vendor -buildvcs=false" go build -o "$work/bin/${pair#*:}" "./cmd/${pair%%:*}" >&2) \
      || die "go build of the operator's cmd/${pair%%:*} failed"
    keep "${pair#*:}"
  done
fi

# The CSI driver (Dockerfile.csi: /hostpath-csi-driver) and the legacy provisioner
# (Dockerfile.controller: /hostpath-provisioner), from the Go archive's tree.
if need hostpath-csi-driver || need hostpath-provisioner; then
  legacy="$("$HACK/build-go-legacy.sh" | tail -n 1)"
  if need hostpath-csi-driver; then
    log "compiling the Go archive's cmd/plugin offline from vendor/"
    (cd "$legacy/src" && GOFLAGS="-mod=vendor -buildvcs=false" go build -o "$work/bin/hostpath-csi-driver" ./cmd/plugin >&2) \
      || die "go build of cmd/plugin failed"
    keep hostpath-csi-driver
  fi
  if need hostpath-provisioner; then
    cp "$legacy/kubevirt-legacy-provisioner" "$work/bin/hostpath-provisioner"
    keep hostpath-provisioner
  fi
fi

# external-provisioner, its module from the proxy (checked against the pinned go.sum hash, and
# by the go command against the checksum database), built as the main module so that its own
# go.mod, replace directives included, picks every dependency (`go install m@v` refuses a
# go.mod with replace directives).
if need csi-provisioner; then
  log "downloading $PROVISIONER_MODULE@$PROVISIONER_VERSION from the Go module proxy"
  info="$(cd "$work" && GOFLAGS="" go mod download -json "$PROVISIONER_MODULE@$PROVISIONER_VERSION")" \
    || die "go mod download $PROVISIONER_MODULE@$PROVISIONER_VERSION failed: $info"
  dir="$(printf '%s\n' "$info" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
  sum="$(printf '%s\n' "$info" | sed -n 's/^[[:space:]]*"Sum": "\(.*\)",$/\1/p')"
  [ "$sum" = "$PROVISIONER_SUM" ] || die "$PROVISIONER_MODULE@$PROVISIONER_VERSION has hash $sum, not the pinned $PROVISIONER_SUM"
  [ -f "$dir/go.mod" ] || die "no go.mod in $dir"
  cp -r "$dir" "$work/external-provisioner"
  chmod -R u+w "$work/external-provisioner"
  # A module zip keeps only vendor/modules.txt, which would turn on vendor mode.
  rm -rf "$work/external-provisioner/vendor"
  log "compiling csi-provisioner $PROVISIONER_VERSION (its dependencies come from the proxy)"
  (cd "$work/external-provisioner" && GOFLAGS="-mod=readonly -buildvcs=false" \
    go build -ldflags "-X main.version=$PROVISIONER_VERSION" -o "$work/bin/csi-provisioner" ./cmd/csi-provisioner >&2) \
    || die "go build of csi-provisioner $PROVISIONER_VERSION failed"
  keep csi-provisioner
fi

# The two sidecars the proxy does not serve: from their tags' trees, offline from vendor/.
build_sidecar() { # NAME VAR ARCHIVE SHA256 VERSION
  local name="$1" var="$2" archive="$3" sha="$4" version="$5" top
  check_archive "$var" "$archive" "$sha"
  mkdir -p "$work/$name-src"
  tar -xzf "$archive" -C "$work/$name-src"
  top="$(find "$work/$name-src" -mindepth 1 -maxdepth 1 -type d | head -n 1)"
  if [ ! -d "$top/cmd/$name" ] || [ ! -f "$top/vendor/modules.txt" ]; then
    die "$archive holds no cmd/$name with vendor/"
  fi
  log "compiling $name $version offline from vendor/"
  (cd "$top" && GOFLAGS="-mod=vendor -buildvcs=false" \
    go build -ldflags "-X main.version=$version" -o "$work/bin/$name" "./cmd/$name" >&2) \
    || die "go build of $name $version failed"
  keep "$name"
}
if [ -n "$registrar_archive" ] && need csi-node-driver-registrar; then
  build_sidecar csi-node-driver-registrar HPP_NODE_DRIVER_REGISTRAR_ARCHIVE "$registrar_archive" "$REGISTRAR_SHA256" "$REGISTRAR_VERSION"
fi
if [ -n "$liveness_archive" ] && need livenessprobe; then
  build_sidecar livenessprobe HPP_LIVENESSPROBE_ARCHIVE "$liveness_archive" "$LIVENESS_SHA256" "$LIVENESS_VERSION"
fi

# The stand-ins (see tests/kubevirt-sidecars/main.go), built whatever archives are given: the
# lane uses them for what is missing.
if [ ! -x "$STANDIN" ]; then
  log "compiling the sidecar stand-ins of tests/kubevirt-sidecars (their modules come from the proxy)"
  mkdir -p "$(dirname "$STANDIN")"
  (cd "$STANDIN_SRC" && GOFLAGS="-mod=readonly -buildvcs=false" go build -o "$work/bin/kubevirt-sidecars" . >&2) \
    || die "go build of tests/kubevirt-sidecars failed"
  mv "$work/bin/kubevirt-sidecars" "$STANDIN"
  log "kubevirt-sidecars: $(du -h "$STANDIN" | cut -f1)"
fi

# What each binary is, where its upstream image puts it, how the operator starts it, and which
# env var of the operator's Deployment (deploy/operator.yaml) names its image.
{
  printf '# binary\tsource\tpath in the upstream image\thow the operator starts it\toperator env var (upstream default)\tstate\n'
  row() { # NAME SOURCE PATH START ENV [WHAT-TO-DO-IF-MISSING]
    local state=built
    [ -x "$OUT/bin/$1" ] || state="missing: ${6:-build it}"
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$5" "$state"
  }
  row hostpath-provisioner-operator "operator@03d4d671 ./cmd/manager" /usr/bin/hostpath-provisioner-operator \
    "command: hostpath-provisioner-operator (operator.yaml; image PATH=/usr/bin)" \
    "OPERATOR_IMAGE (quay.io/kubevirt/hostpath-provisioner-operator:latest)"
  row mounter "operator@03d4d671 ./cmd/mounter" /usr/bin/mounter \
    "command: /usr/bin/mounter --storagePoolPath P --mountPath P --hostPath /host [--unmount] (storage-pool Deployments, root, privileged)" \
    "OPERATOR_IMAGE (the operator's own image)"
  row hostpath-csi-driver "hostpath-provisioner@7c142255 ./cmd/plugin" /hostpath-csi-driver \
    "ENTRYPOINT /hostpath-csi-driver; args --drivername=kubevirt.io.hostpath-provisioner --v=N --endpoint=\$(CSI_ENDPOINT) --nodeid=\$(NODE_NAME) --version=\$(VERSION) --datadir=\$(PV_DIR) --metrics-tls-version=V" \
    "CSI_PROVISIONER_IMAGE (quay.io/kubevirt/hostpath-csi-driver:latest)"
  row hostpath-provisioner "hostpath-provisioner@7c142255 ./cmd/provisioner" /hostpath-provisioner \
    "CMD /hostpath-provisioner, no args; env USE_NAMING_PREFIX NODE_NAME PV_DIR (legacy CR only)" \
    "PROVISIONER_IMAGE (quay.io/kubevirt/hostpath-provisioner:latest)"
  row csi-provisioner "$PROVISIONER_MODULE@$PROVISIONER_VERSION ./cmd/csi-provisioner" /csi-provisioner \
    "ENTRYPOINT /csi-provisioner; args --v=N --csi-address=/csi/csi.sock --feature-gates=Topology=true --enable-capacity=true --capacity-for-immediate-binding=true --extra-create-metadata=true --immediate-topology=false --strict-topology=true --node-deployment=true --default-fstype=xfs" \
    "CSI_SIG_STORAGE_PROVISIONER_IMAGE (registry.k8s.io/sig-storage/csi-provisioner:v3.4.1)"
  row csi-node-driver-registrar "node-driver-registrar@$REGISTRAR_VERSION ./cmd/csi-node-driver-registrar" /csi-node-driver-registrar \
    "ENTRYPOINT /csi-node-driver-registrar; args --v=N --csi-address=/csi/csi.sock --kubelet-registration-path=/var/lib/kubelet/plugins/csi-hostpath/csi.sock" \
    "NODE_DRIVER_REG_IMAGE (registry.k8s.io/sig-storage/csi-node-driver-registrar:v2.2.0)" "set HPP_NODE_DRIVER_REGISTRAR_ARCHIVE (the stand-in in sidecar-standins/ is used)"
  row livenessprobe "livenessprobe@$LIVENESS_VERSION ./cmd/livenessprobe" /livenessprobe \
    "ENTRYPOINT /livenessprobe; args --csi-address=/csi/csi.sock --health-port=9898" \
    "LIVENESS_PROBE_IMAGE (registry.k8s.io/sig-storage/livenessprobe:v2.3.0)" "set HPP_LIVENESSPROBE_ARCHIVE (the stand-in in sidecar-standins/ is used)"
} >"$work/images.tsv"
mv "$work/images.tsv" "$OUT/images.tsv"
rm -rf "$work"

for name in csi-node-driver-registrar livenessprobe; do
  [ -x "$OUT/bin/$name" ] || log "$name not built (the module proxy serves it in no version): its stand-in will be used; give its source archive for the real one (this script's header)"
done
log "done in $((SECONDS - start)) s"
echo "$OUT"
