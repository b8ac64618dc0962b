#!/usr/bin/env bash
# `make test`: everything the suite needs, then the suite. Run from the repository's root by the
# Makefile. Prints how long each step took, so a slow run shows where its time went.
#
# On 2 cores a cold run is mostly compiling: the control plane, promtool, helm and kube-score
# (Go, downloaded from the module proxy), the lint, the image's static binaries and the tests
# (Rust). Each of these has stretches where one core waits: downloads, a link, the one crate
# everything else needs. So three chains run at once and fill each other's gaps:
#
#   Go tools    control plane, promtool, helm and kube-score; then, niced, the oldest-Kubernetes
#               control plane (`make test-oldest-k8s`), which nothing needs until the end
#   image       `make image` (its static builds have their own target directories)
#   tests       fmt, clippy, and the test binaries (they share target/ with the image chain's
#               first step, building its tool, so that step runs first, alone)
#
# Then the suite and the real-node lane run at the same time (they mostly wait on API servers,
# kubelets and pods), and last the tests against the oldest Kubernetes.
#
# The Go and image chains write to logs under target/make-test/, printed when a step fails.
set -uo pipefail

CARGO="${CARGO:-cargo}"
IMAGE_PLATFORMS="${IMAGE_PLATFORMS:-linux/amd64,linux/arm64}"
OLDEST_K8S_VERSION="${OLDEST_K8S_VERSION:-v1.25.4}"
LOGS=target/make-test
mkdir -p "$LOGS"

started=$SECONDS
say() { printf '== [%s] %s\n' "$(date -u -d "@$((SECONDS - started))" +%H:%M:%S)" "$*"; }
fail() { say "FAILED: $*"; exit 1; }
# show LOG: the log's last lines, after a failure.
show() { echo "---- last lines of $1"; tail -40 "$1"; echo "----"; }

oldest_k8s() {
  K8S_VERSION="$OLDEST_K8S_VERSION" K8S_COMMANDS="kube-apiserver kube-controller-manager kube-scheduler kubectl" "$@"
}

say "building the Go tools (log: $LOGS/go-tools.log) and, after them, Kubernetes $OLDEST_K8S_VERSION (log: $LOGS/oldest-k8s-build.log)"
(
  set -e
  bash hack/build-control-plane.sh
  bash hack/build-promtool.sh
  bash hack/build-deploy-tools.sh
  echo "go tools ready after $((SECONDS - started)) s"
  touch "$LOGS/go-tools.done"
  oldest_k8s nice -n 10 bash hack/build-control-plane.sh >"$LOGS/oldest-k8s-build.log" 2>&1
) >"$LOGS/go-tools.log" 2>&1 &
go_tools=$!
rm -f "$LOGS/go-tools.done"

say "building the image's builder"
"$CARGO" build -q -p testbed --bin image || fail "building testbed's image tool"
say "building the image for $IMAGE_PLATFORMS (log: $LOGS/image.log)"
# Run directly, not by `cargo run`, which would wait for clippy's lock on target/ to check it.
"${CARGO_TARGET_DIR:-target}/debug/image" --platform "$IMAGE_PLATFORMS" >"$LOGS/image.log" 2>&1 &
image=$!

say "lint: cargo fmt --check, clippy"
"$CARGO" fmt --all -- --check || fail "cargo fmt --check"
"$CARGO" clippy --workspace --all-targets -- -D warnings || fail "clippy"
say "compiling the tests"
"$CARGO" test --workspace --all-targets --no-run || fail "compiling the tests"

say "waiting for the image"
wait "$image" || { show "$LOGS/image.log"; fail "make image"; }
grep -E '^(image|  )' "$LOGS/image.log"
say "waiting for the Go tools"
while [ ! -e "$LOGS/go-tools.done" ]; do
  if ! kill -0 "$go_tools" 2>/dev/null; then
    wait "$go_tools"
    show "$LOGS/go-tools.log"
    fail "building the Go tools"
  fi
  sleep 2
done
tail -1 "$LOGS/go-tools.log"

say "the suite, and the real-node lane beside it (log: $LOGS/real-nodes.log)"
"$CARGO" test --test e2e_real_nodes >"$LOGS/real-nodes.log" 2>&1 &
lane=$!
TESTBED_REAL_NODES_APART=1 "$CARGO" test --workspace --all-targets -- --test-threads="${E2E_THREADS:-4}"
suite=$?
say "the suite finished (status $suite); waiting for the real-node lane"
wait "$lane"
lane_status=$?
echo "== the real-node lane ($LOGS/real-nodes.log)"
cat "$LOGS/real-nodes.log"
[ "$suite" -eq 0 ] || fail "the suite"
[ "$lane_status" -eq 0 ] || fail "the real-node lane"

say "waiting for Kubernetes $OLDEST_K8S_VERSION"
wait "$go_tools" || { show "$LOGS/oldest-k8s-build.log"; fail "building Kubernetes $OLDEST_K8S_VERSION"; }
say "the tests against Kubernetes $OLDEST_K8S_VERSION"
"${MAKE:-make}" --no-print-directory test-oldest-k8s || fail "make test-oldest-k8s"
say "make test passed"
