#!/usr/bin/env bash
# Runs every check the project has, in order, and stops at the first failure:
#
#   1. scripts/install-deps.sh   (Debian's memcached for the differential tests, tools, ...)
#   2. cargo fmt --all -- --check
#   3. cargo clippy --workspace --all-targets -- -D warnings
#   4. cargo test --workspace    (unit, integration, differential, property tests, doc tests)
#      and the server's integration tests once more under the epoll runtime (KVCACHED_IO),
#      and its protocol and connection suites under io_uring with SQPOLL (KVCACHED_IO_SQPOLL)
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

# tests LABEL COMMAND...: run a cargo test command, add its counts to the totals, and stop
# with the summary line if it failed.
passed=0
ignored=0
tests() {
    local label=$1 status=0 p f g
    shift
    step "$label"
    : >"$test_log"
    "$@" 2>&1 | tee "$test_log" || status=$?
    read -r p f g < <(counts)
    passed=$((passed + p))
    ignored=$((ignored + g))
    if ((status != 0)); then
        ((f > 0)) || f=1
        echo
        echo "test.sh: $label failed after $(elapsed)"
        echo "test.sh: $passed passed, $f failed, $ignored skipped"
        exit "$status"
    fi
}

tests "cargo test --workspace" cargo test --workspace --no-fail-fast --quiet

# The integration tests again under the other I/O runtime: the first pass ran the default
# (io_uring where the kernel allows it), this one epoll (KVCACHED_IO sets kvcached's
# default -o io). Where io_uring is not available both passes run epoll.
tests "cargo test -p kvcached --tests, KVCACHED_IO=epoll" \
    env KVCACHED_IO=epoll cargo test -p kvcached --tests --no-fail-fast --quiet

# The protocol and connection suites once more with a kernel thread polling each worker's
# submission queue (-o io_sqpoll; KVCACHED_IO_SQPOLL sets its default). Where io_uring or
# SQPOLL is not available the servers run without it.
tests "cargo test -p kvcached (protocols, connections), KVCACHED_IO_SQPOLL=10" \
    env KVCACHED_IO_SQPOLL=10 cargo test -p kvcached --no-fail-fast --quiet \
    --test text_protocol --test binary --test meta --test connections \
    --test hostile_clients --test lifecycle --test tls

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
echo "test.sh: $passed passed, 0 failed, $ignored skipped"
