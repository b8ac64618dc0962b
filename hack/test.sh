#!/usr/bin/env bash
# `make test`: everything the suite needs, then the suite. Run from the repository's root by the
# Makefile. Prints how long each step took, so a slow run shows where its time went.
#
# On 2 cores a cold run is mostly compiling: the control plane, promtool, helm and kube-score
# (Go, downloaded from the module proxy), the lint, the image's static binaries and the tests
# (Rust). Each of these has stretches where one core waits: downloads, a link, the one crate
# everything else needs. So three chains run at once and fill each other's gaps:
#
#   Go tools    control plane, promtool, helm and kube-score, the OCI registry; then, niced,
#               the oldest-Kubernetes control plane (`make test-oldest-k8s`), which nothing
#               needs until the end
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
# The arm64 binary, cross-compiled, only runs under qemu in e2e_foreign_arches: built unoptimized
# (`dev`), it costs a cold run far less CPU (testbed::real_nodes::images::cross_profile). The image
# tool and that test read the same variable, so the test finds the binary the image chain built.
# linux/ppc64le and linux/s390x are not built here but by `make test-more-arches` (Makefile).
export HPP_ARM64_PROFILE="${HPP_ARM64_PROFILE:-dev}"
LOGS=target/make-test
mkdir -p "$LOGS"
rm -f "$LOGS/cpu.txt" "$LOGS/image.done"

started=$SECONDS
say() { printf '== [%s] %s\n' "$(date -u -d "@$((SECONDS - started))" +%H:%M:%S)" "$*"; }
fail() { say "FAILED: $*"; exit 1; }
# cpu STEP COMMAND...: runs COMMAND and notes the CPU time it and its children used in
# $LOGS/cpu.txt, printed at the end: on 2 busy cores, CPU time, not wall time, says what a step
# costs the run.
cpu() {
  local step=$1
  shift
  (
    "$@"
    status=$?
    # Into a file, not a pipe: a pipeline's side is a new process, whose children's times start
    # at zero.
    times_file="$LOGS/cpu.$BASHPID"
    times >"$times_file"
    tail -1 "$times_file" | awk -v step="$step" '{ split($1, u, /[ms]/); split($2, s, /[ms]/);
      printf "%-34s %6.0f s\n", step, u[1] * 60 + u[2] + s[1] * 60 + s[2] }' >>"$LOGS/cpu.txt"
    rm -f "$times_file"
    exit "$status"
  )
}
# show LOG: the log's last lines, after a failure.
show() { echo "---- last lines of $1"; tail -40 "$1"; echo "----"; }

oldest_k8s() {
  K8S_VERSION="$OLDEST_K8S_VERSION" K8S_COMMANDS="kube-apiserver kube-controller-manager kube-scheduler kubectl" "$@"
}

say "building the Go tools (log: $LOGS/go-tools.log) and, after them, Kubernetes $OLDEST_K8S_VERSION (log: $LOGS/oldest-k8s-build.log)"
(
  set -e
  cpu "control plane (Go)" bash hack/build-control-plane.sh
  cpu "promtool (Go)" bash hack/build-promtool.sh
  cpu "helm, kube-score (Go)" bash hack/build-deploy-tools.sh
  cpu "OCI registry (Go)" bash hack/build-registry.sh
  echo "go tools ready after $((SECONDS - started)) s"
  touch "$LOGS/go-tools.done"
  cpu "Kubernetes $OLDEST_K8S_VERSION (Go, niced)" oldest_k8s nice -n 10 bash hack/build-control-plane.sh >"$LOGS/oldest-k8s-build.log" 2>&1
) >"$LOGS/go-tools.log" 2>&1 &
go_tools=$!
rm -f "$LOGS/go-tools.done"

say "building the image's builder"
cpu "image tool" "$CARGO" build -q -p testbed --bin image || fail "building testbed's image tool"
say "building the image for $IMAGE_PLATFORMS (log: $LOGS/image.log)"
# Run directly, not by `cargo run`, which would wait for clippy's lock on target/ to check it.
cpu "image ($IMAGE_PLATFORMS)" "${CARGO_TARGET_DIR:-target}/debug/image" --platform "$IMAGE_PLATFORMS" >"$LOGS/image.log" 2>&1 &
image=$!

say "lint: cargo fmt --check, clippy"
"$CARGO" fmt --all -- --check || fail "cargo fmt --check"
cpu "clippy" "$CARGO" clippy --workspace --all-targets -- -D warnings || fail "clippy"
say "compiling the tests"
cpu "compiling the tests" "$CARGO" test --workspace --all-targets --no-run || fail "compiling the tests"

say "waiting for the image"
wait "$image" || { show "$LOGS/image.log"; fail "make image"; }
# For hack/build-lane-tools.sh beside this run (.ci/run): the image's target directory is free.
touch "$LOGS/image.done"
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
cpu "real-node lane" "$CARGO" test --test e2e_real_nodes >"$LOGS/real-nodes.log" 2>&1 &
lane=$!
TESTBED_REAL_NODES_APART=1 cpu "the suite" "$CARGO" test --workspace --all-targets -- --test-threads="${E2E_THREADS:-4}"
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
cpu "tests on Kubernetes $OLDEST_K8S_VERSION" "${MAKE:-make}" --no-print-directory test-oldest-k8s || fail "make test-oldest-k8s"
say "make test passed"
echo "== CPU time per step (user + system, with children)"
cat "$LOGS/cpu.txt"
