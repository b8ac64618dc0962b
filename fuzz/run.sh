#!/usr/bin/env bash
# Runs one fuzz target for a while and prints libFuzzer's execution count.
#
#   fuzz/run.sh TARGET SECONDS [extra libFuzzer flags...]
#
# Works on the stable toolchain (RUSTC_BOOTSTRAP=1 lets cargo fuzz pass its nightly-only flags).
# FUZZ_SANITIZER=none skips AddressSanitizer (default: address). One job, one process.
# Seeds from fuzz/seeds/TARGET are copied into fuzz/corpus/TARGET (git-ignored) first.
# Exit status: libFuzzer's (0 when no crash).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
usage="usage: fuzz/run.sh TARGET SECONDS [libFuzzer flags...]"
target="${1:?$usage}"
seconds="${2:?$usage}"
shift 2

corpus="$here/corpus/$target"
mkdir -p "$corpus"
if [ -d "$here/seeds/$target" ]; then
    for seed in "$here/seeds/$target"/*; do
        [ -e "$corpus/$(basename "$seed")" ] || cp "$seed" "$corpus/"
    done
fi
dict=()
if [ -f "$here/dicts/$target.dict" ]; then
    dict=("-dict=$here/dicts/$target.dict")
fi

# clap reads every setting from the environment too: keep the config target reproducible.
unset NODE_NAME PV_DIR STORAGE_POOLS POD_NAMESPACE NODE_LEASE_SECONDS USE_NAMING_PREFIX PROVISIONER_NAME KUBECONFIG PV_CAPACITY DIR_MODE \
    REQUIRE_MOUNTPOINT PV_FINALIZER PUBLISH_CAPACITY PROVISION_ON_NODE RESERVED_SPACE MAX_CONCURRENCY METRICS_ADDR HEALTH_ADDR LOG_FORMAT

export RUSTC_BOOTSTRAP=1
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
cd "$here/.."
set +e
cargo fuzz run --sanitizer "${FUZZ_SANITIZER:-address}" --debug-assertions "$target" "$corpus" -- \
    -max_total_time="$seconds" -print_final_stats=1 -timeout=30 "${dict[@]}" "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
execs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)"
echo "fuzz/run.sh: target=$target seconds=$seconds executions=${execs:-unknown} exit=$status"
exit "$status"
