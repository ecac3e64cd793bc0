#!/usr/bin/env bash
# Runs cargo test on a machine made several times slower: every test process, and every
# server a test starts, pinned to one CPU that a CPU-burning neighbour shares. A test that
# depends on machine speed (a deadline too short, a helper that must do some amount of work
# in a time box, a race with a background thread) shows up here; run the suite unpinned on an
# idle machine too, to see the other side.
#
#   scripts/slow-tests.sh [CARGO TEST ARGS...]     # default: --workspace
#   SLOW_CPU=1 scripts/slow-tests.sh -p kvcached --test connections
#
# The tests are built first, unpinned, so only running them is slowed down. The neighbour
# is stopped when the script ends, and in any case after SLOW_LIMIT seconds (default 7200).
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"

cpu="${SLOW_CPU:-0}"
limit="${SLOW_LIMIT:-7200}"
if (($# == 0)); then
    set -- --workspace
fi

command -v taskset >/dev/null 2>&1 || {
    echo "slow-tests.sh: taskset not found (Debian's util-linux)" >&2
    exit 1
}

cargo test --no-run --quiet "$@"

# The neighbour: a shell loop on the same CPU, bounded by time.
taskset -c "$cpu" timeout "$limit" sh -c 'while :; do :; done' &
burner=$!
trap 'kill "$burner" 2>/dev/null || true' EXIT

echo "slow-tests.sh: cargo test $* on CPU $cpu beside a CPU-burning neighbour (pid $burner)"
taskset -c "$cpu" cargo test --no-fail-fast "$@"
