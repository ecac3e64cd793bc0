#!/usr/bin/env bash
# Runs every check the project has, in order, and stops at the first failure:
#
#   1. scripts/install-deps.sh   (Debian's memcached for the differential tests, tools, ...)
#   2. cargo fmt --all -- --check
#   3. cargo clippy --workspace --all-targets -- -D warnings
#   4. cargo test --workspace    (unit, integration, differential, property tests, doc tests)
#      and the server's integration tests once more under the epoll runtime (KVCACHED_IO)
#   5. scripts/package.sh --profile dev --check
#                                (the Debian package and the container's command line)
#   6. scripts/fuzz.sh 30        (each fuzz target for 30 s)
#
# then prints one summary line. Environment: FUZZ_SECONDS (default 30; 0 skips fuzzing),
# and anything cargo reads (CARGO_TARGET_DIR, ...).
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"

started=$SECONDS
fuzz_seconds="${FUZZ_SECONDS:-30}"
test_log="$(mktemp)"
trap 'rm -f "$test_log"' EXIT

step() { printf '\n==> %s\n' "$*"; }
elapsed() { printf '%dm%02ds' $(((SECONDS - started) / 60)) $(((SECONDS - started) % 60)); }

# Sum libtest's "test result:" lines: passed, failed, ignored.
counts() {
    awk '/^test result:/ {
            for (i = 1; i <= NF; i++) {
                if ($(i + 1) ~ /^passed/) p += $i
                if ($(i + 1) ~ /^failed/) f += $i
                if ($(i + 1) ~ /^ignored/) g += $i
            }
         }
         END { printf "%d %d %d\n", p, f, g }' "$test_log"
}

step "install dependencies"
scripts/install-deps.sh

step "cargo fmt --all -- --check"
cargo fmt --all -- --check

step "cargo clippy --workspace --all-targets -- -D warnings"
cargo clippy --workspace --all-targets --quiet -- -D warnings

step "cargo test --workspace"
test_status=0
cargo test --workspace --no-fail-fast --quiet 2>&1 | tee "$test_log" || test_status=$?
read -r passed failed ignored < <(counts)
if ((test_status != 0)); then
    ((failed > 0)) || failed=1
    echo
    echo "test.sh: cargo test failed after $(elapsed)"
    echo "test.sh: $passed passed, $failed failed, $ignored skipped"
    exit "$test_status"
fi

# The integration tests again under the other I/O runtime: the first pass ran the default
# (io_uring where the kernel allows it), this one epoll (KVCACHED_IO sets kvcached's
# default -o io). Where io_uring is not available both passes run epoll.
step "cargo test -p kvcached --tests, KVCACHED_IO=epoll"
: >"$test_log"
KVCACHED_IO=epoll cargo test -p kvcached --tests --no-fail-fast --quiet 2>&1 | tee "$test_log" || test_status=$?
read -r passed2 failed2 ignored2 < <(counts)
passed=$((passed + passed2))
ignored=$((ignored + ignored2))
if ((test_status != 0)); then
    ((failed2 > 0)) || failed2=1
    echo
    echo "test.sh: cargo test (epoll) failed after $(elapsed)"
    echo "test.sh: $passed passed, $failed2 failed, $ignored skipped"
    exit "$test_status"
fi

step "scripts/package.sh --profile dev --check"
scripts/package.sh --profile dev --check

fuzz_note="fuzz skipped"
if ((fuzz_seconds > 0)) && [[ -x scripts/fuzz.sh ]]; then
    step "scripts/fuzz.sh $fuzz_seconds"
    scripts/fuzz.sh "$fuzz_seconds"
    fuzz_note="fuzz ${fuzz_seconds}s per target"
fi

echo
echo "test.sh: fmt, clippy, tests, package check and $fuzz_note all passed in $(elapsed)"
echo "test.sh: $passed passed, $failed failed, $ignored skipped"
