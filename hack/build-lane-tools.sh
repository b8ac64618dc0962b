#!/usr/bin/env bash
# Builds ahead what the lanes .ci/run runs after `make test` would otherwise build first, one
# after another: the kubevirt operator's programs (`make test-kubevirt-migration`), the pinned
# earlier commits' binaries (`make test-upgrade`) and the linux/ppc64le and linux/s390x binaries
# (`make test-more-arches`). .ci/run starts it at nice 19 beside `make test`, whose suite and
# real-node lane mostly wait on API servers and kubelets and leave a core idle: on a cold
# machine these builds are about half an hour of CPU. Each lane's own step then finds its build
# cached. Nothing here is needed for correctness: a lane started without it builds the same.
#
# Usage: hack/build-lane-tools.sh [--after FILE]
#   --after FILE  start the Cargo builds only once FILE exists: `make test` writes
#                 target/make-test/image.done when its image chain has finished, so these builds
#                 never hold the image's target directory (or the cross toolchain's lock) while
#                 `make test` waits for it behind a niced process. The Go build starts at once.
# Variables: EARLIER_COMMITS (the Makefile's EARLIER_COMMIT and EARLIER_SNAPSHOTS_COMMIT),
# MORE_ARCHES_PLATFORMS and the HPP_*_PROFILE variables as the Makefile sets them, and the
# kubevirt archives (HPP_KUBEVIRT_OPERATOR_ARCHIVE, HPP_GO_LEGACY_ARCHIVE).
set -euo pipefail

after=""
if [ "${1:-}" = "--after" ]; then
  after="${2:?--after needs a file}"
  shift 2
fi
[ "$#" -eq 0 ] || { echo "usage: $0 [--after FILE]" >&2; exit 2; }
cd "$(dirname "$0")/.."
: "${EARLIER_COMMITS:?EARLIER_COMMITS names the earlier commits to build (the Makefile sets it)}"
: "${MORE_ARCHES_PLATFORMS:?MORE_ARCHES_PLATFORMS names the image platforms (the Makefile sets it)}"

started=$SECONDS
say() { printf '== [lane tools, %4d s] %s\n' "$((SECONDS - started))" "$*"; }

say "the kubevirt operator's programs (hack/build-kubevirt-csi.sh)"
bash hack/build-kubevirt-csi.sh >/dev/null

if [ -n "$after" ]; then
  say "waiting for $after"
  while [ ! -e "$after" ]; do sleep 5; done
fi
for commit in $EARLIER_COMMITS; do
  say "the provisioner of earlier commit $commit (hack/build-earlier-provisioner.sh)"
  bash hack/build-earlier-provisioner.sh "$commit" >/dev/null
done
# The image tool, which `make test` builds first: run directly, as hack/test.sh does, not by
# `cargo run`, which would queue behind the suite's Cargo lock.
[ -x "${CARGO_TARGET_DIR:-target}/debug/image" ] || "${CARGO:-cargo}" build -q -p testbed --bin image
say "the image for $MORE_ARCHES_PLATFORMS"
"${CARGO_TARGET_DIR:-target}/debug/image" --platform "$MORE_ARCHES_PLATFORMS" \
  --out target/image/hostpath-provisioner-all-platforms.oci.tar >/dev/null
say "done"
