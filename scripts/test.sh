#!/usr/bin/env bash
# Runs every check the project has, in order, and runs each one even when an earlier one
# failed, so that one failure never hides the state of the rest:
#
#   1. scripts/install-deps.sh   (Debian's memcached for the differential tests, tools, ...)
#   2. cargo fmt --all -- --check
#   3. cargo clippy --workspace --all-targets -- -D warnings
#   4. cargo test --workspace    (unit, integration, differential, property tests, doc tests)
#      and the server's integration tests once more under the epoll runtime (KVCACHED_IO),
#      and its protocol and connection suites under io_uring with SQPOLL (KVCACHED_IO_SQPOLL)
#   5. scripts/package.sh --profile dev --check
#                                (the Debian package and the container's command line)
#   6. scripts/memcached-suite.sh (memcached's own test suite against the debug kvcached),
#      when MEMCACHED_SRC names a memcached source tree (1.6.45); skipped otherwise, as no
#      Debian package has it
#   7. scripts/fuzz.sh 30        (each fuzz target for 30 s)
#
# At the end it prints one line per step (ok or FAILED, its time, and for test steps the
# counts and the names of the failed tests; above it, the lines around each failed test's
# panic), then a total line; tests that passed without checking everything because this
# machine lacks something (io_uring, root, a tool) say so with a `SKIP <test>: <why>` line
# and are counted as skipped (`tests/common/skip.rs`); `#[ignore]`d tests are counted as
# ignored. It exits 0 only if every step passed.
# Environment: FUZZ_SECONDS (default 30; 0 skips fuzzing), MEMCACHED_SRC (a memcached
# source tree, for step 6), and anything cargo reads (CARGO_TARGET_DIR, ...).
set -uo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"

started=$SECONDS
fuzz_seconds="${FUZZ_SECONDS:-30}"
test_log="$(mktemp)"
trap 'rm -f "$test_log"' EXIT

# One entry per step, in order: its label, "ok" or "FAILED", its time, and a detail line.
labels=()
results=()
times=()
details=()
failed_steps=0
passed=0
failed=0
ignored=0
skipped=0

mmss() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }

# record LABEL STATUS SECONDS [DETAIL]
record() {
    labels+=("$1")
    if (($2 == 0)); then
        results+=(ok)
    else
        results+=(FAILED)
        failed_steps=$((failed_steps + 1))
    fi
    times+=("$(mmss "$3")")
    details+=("${4:-}")
}

# step LABEL COMMAND...: run a command as one step and record its result.
step() {
    local label=$1 status=0 t0=$SECONDS
    shift
    printf '\n==> %s\n' "$label"
    "$@" || status=$?
    ((status == 0)) || echo "test.sh: $label failed (exit $status)"
    record "$label" "$status" $((SECONDS - t0))
}

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

# Tests that said they skipped (`SKIP <test>: <why>`, written to stderr uncaptured, so it
# may follow the progress dots of --quiet on the same line).
skips() {
    grep -oE 'SKIP [^ ]+: ' "$test_log" | wc -l
}

# The names libtest lists under its closing "failures:" heading, space-separated.
failures() {
    awk '/^failures:$/ { list = 1; next }
         list && /^    [^ ]+$/ { sub(/^    /, ""); names[$0] = 1; next }
         { list = 0 }
         END { for (n in names) printf "%s ", n }' "$test_log"
}

# What libtest printed for each failed test ("---- NAME stdout ----" sections: the test's
# captured output and its panic, without a backtrace): for the first two of a step, a few
# lines before the panic and a dozen from it, cut to 200 characters, collected in `why`
# and printed just above the summary, so that the end of a long log says why a test failed.
failure_output() {
    awk '/^---- .* stdout ----$/ { flush(); name = $2; n = 0; p = -1; sect = 1; next }
         /^failures:$/ { flush(); sect = 0; next }
         sect && /^stack backtrace:$/ { bt = 1; next }
         sect && bt && /^ / { next }
         sect { bt = 0; if (p < 0 && /panicked at/) p = n; line[n++] = $0 }
         function flush(   i, from, to) {
             if (!sect || shown++ >= 2) return
             printf "  ---- %s\n", name
             from = p < 0 ? n - 12 : p - 4
             to = p < 0 ? n : p + 12
             for (i = from < 0 ? 0 : from; i < to && i < n; i++)
                 printf "  | %s\n", substr(line[i], 1, 200)
         }
         END { flush() }' "$test_log"
}
why=""

# tests LABEL COMMAND...: a cargo test command as one step; its counts go into the totals
# and its failed tests' names into the summary.
tests() {
    local label=$1 status=0 t0=$SECONDS p f g s detail
    shift
    printf '\n==> %s\n' "$label"
    : >"$test_log"
    "$@" 2>&1 | tee "$test_log" || status=$?
    read -r p f g < <(counts)
    s=$(skips)
    # A build failure or a crashed test binary fails the step without a "failed" count.
    ((status == 0 || f > 0)) || f=1
    passed=$((passed + p))
    failed=$((failed + f))
    ignored=$((ignored + g))
    skipped=$((skipped + s))
    detail="$p passed ($s of them skipped in whole or part), $f failed, $g ignored"
    if ((status != 0)); then
        local names
        names="$(failures)"
        [[ -z $names ]] || detail+="; failed: ${names% }"
        why+="$(failure_output)"$'\n'
    fi
    record "$label" "$status" $((SECONDS - t0)) "$detail"
}

step "install dependencies" scripts/install-deps.sh

step "cargo fmt --all -- --check" cargo fmt --all -- --check

step "cargo clippy --workspace --all-targets -- -D warnings" \
    cargo clippy --workspace --all-targets --quiet -- -D warnings

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

step "scripts/package.sh --profile dev --check" scripts/package.sh --profile dev --check

# memcached's own suite, from a source tree the user has (the project fetches nothing).
memcached_suite() {
    cargo build --quiet -p kvcached &&
        scripts/memcached-suite.sh -s "${CARGO_TARGET_DIR:-target}/debug/kvcached" "$MEMCACHED_SRC"
}
if [[ -n ${MEMCACHED_SRC:-} ]]; then
    step "scripts/memcached-suite.sh $MEMCACHED_SRC" memcached_suite
else
    labels+=("scripts/memcached-suite.sh (memcached's t/)")
    results+=(skipped)
    times+=("-")
    details+=("MEMCACHED_SRC is not set: a memcached 1.6.45 source tree (git archive 1.6.45)")
fi

if ((fuzz_seconds > 0)) && [[ -x scripts/fuzz.sh ]]; then
    step "scripts/fuzz.sh $fuzz_seconds" scripts/fuzz.sh "$fuzz_seconds"
else
    labels+=("fuzz")
    results+=(skipped)
    times+=("-")
    details+=("FUZZ_SECONDS=$fuzz_seconds")
fi

if [[ -n ${why//$'\n'/} ]]; then
    echo
    echo "test.sh: what the failed tests printed around their panics"
    printf '%s' "$why"
fi
echo
echo "test.sh: summary after $(mmss $((SECONDS - started)))"
for i in "${!labels[@]}"; do
    printf '  %-7s %-7s %s\n' "${results[$i]}" "${times[$i]}" "${labels[$i]}"
    [[ -z ${details[$i]} ]] || printf '                  %s\n' "${details[$i]}"
done
echo "test.sh: $passed passed ($skipped of them skipped in whole or part), $failed failed, $ignored ignored"
if ((failed_steps > 0)); then
    echo "test.sh: $failed_steps of ${#labels[@]} steps failed"
    exit 1
fi
echo "test.sh: all ${#labels[@]} steps passed"
