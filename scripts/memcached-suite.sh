#!/usr/bin/env bash
# Runs memcached's own test suite (the t/*.t files of a memcached source tree) against
# kvcached, the way memcached's `make test` runs it against its debug build, and checks every
# result against the list of known exceptions below:
#
#   scripts/memcached-suite.sh [OPTIONS] SOURCE [TEST...]
#
#   SOURCE      a memcached source tree: a git checkout or an export of a release (1.6.45 is
#               the release this list was made with), holding t/ and doc/. The project
#               fetches nothing: get one with `git clone https://github.com/memcached/memcached`
#               and `git -C memcached checkout 1.6.45`, or `git archive 1.6.45 | tar -x`.
#               MEMCACHED_SRC is read when SOURCE is not given. Debian packages only
#               memcached 1.6.18 (whose tests check 1.6.18's behaviour, where kvcached
#               follows the newest release), so scripts/install-deps.sh does not get one.
#   TEST...     file names without .t (e.g. stats lru-crawler); default: every t/*.t
#   -s SERVER   the server to test (default: target/release/kvcached, built if missing).
#               A memcached debug build (memcached-debug) may be given instead, to check the
#               suite itself: then every file must pass and the exceptions are not applied.
#   -t SECONDS  time limit of one file (default 120)
#   -k DIR      keep each file's output in DIR (default: a temporary directory, removed)
#   -v          print each file's whole output
#
# The suite expects a build directory: `memcached-debug` and `timedrun` beside t/. This script
# makes one in a temporary directory: links to SOURCE's files, a `timedrun` that runs its
# command (the time limit is this script's), and a `memcached-debug` that runs the server with
# `-o debug_clock` (kvcached's `debugtime`, which memcached's debug build has built in). Each
# server a file starts is remembered by its process id and stopped after the file if it is
# still running.
#
# Each file is `ok` (ran its whole plan, no failure), `skipped` (the file skipped itself: the
# proxy, extstore, TLS without SSL_TEST=1, SASL without RUN_SASL_TESTS=1, ...), `expected`
# (exactly the failures listed below, each an assertion about memcached's slab allocator,
# slab mover or LRU internals, explained in docs/COMPATIBILITY.md; or a file listed as
# stopping at an assertion, which the script stops there) or FAILED: a new failure, a file
# that died or ran out of time, or a listed failure that no longer happens (remove it from
# the list). The last line is the summary; the exit status is 0 only if no file FAILED.
set -uo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"

# The known exceptions: "FILE NUMBER DESCRIPTION" for one assertion (number and description
# as the file prints them), "FILE *" for a file whose every assertion is about memcached's
# internals, "FILE NUMBER+ WHY" for a file that, after assertion NUMBER, waits for what
# kvcached does not do: the script stops it once NUMBER is reported (1 to NUMBER must pass;
# the rest is not run). Keep in step with docs/COMPATIBILITY.md ("memcached's test suite").
expected=(
    # memcached's allocator hook T_MEMD_INITIAL_MALLOC fakes 4 GiB already allocated.
    "64bit 3 expected (faked) value of total_malloced"
    "64bit 5 hit size limit"
    # memcached reuses expired items' chunks in place; the log writes new items anew.
    "issue_14 21 Memory grows.."
    # The segmented LRU and its maintainer (hot/warm/cold/temp queues, exact eviction order).
    "lru *"
    "lru-maintainer *"
    # How many 70 KB items 8 MB of slab pages hold, and the slab mover.
    "slabs-cas 61 items in the expected slab class"
    "slabs-cas 118 slab rebalancer started"
    "slabs-mover *"
    "slabs_reassign *"
    "slabs-reassign2 *"
    "slabs-reassign-chunked *"
    # After 13 the file fills the cache, starts an evictions watcher, stores one more item
    # and reads the watcher until an eviction line comes. memcached evicts an item for each
    # allocation in a full cache; kvcached evicts a whole segment (about 95 items of that
    # size) when a write needs a new one, so that one store evicts nothing and the file
    # would wait forever. Stopped there: its remaining 30 assertions (value sizes, watcher
    # stats, -W, deletions) are not run.
    "watcher 13+ waits for an eviction after one store into a full cache"
)

server=""
limit=120
keep=""
verbose=0
usage() {
    sed -n '2,/^set -uo/{/^set -uo/d;s/^# \{0,1\}//;p}' "$0" >&2
    exit 2
}
while getopts ":s:t:k:vh" opt; do
    case $opt in
    s) server=$OPTARG ;;
    t) limit=$OPTARG ;;
    k) keep=$OPTARG ;;
    v) verbose=1 ;;
    *) usage ;;
    esac
done
shift $((OPTIND - 1))
src=${1:-${MEMCACHED_SRC:-}}
(($# > 0)) && shift
[[ -n $src ]] || usage
if [[ ! -d $src/t || ! -f $src/t/lib/MemcachedTest.pm ]]; then
    echo "memcached-suite.sh: $src is not a memcached source tree (no t/lib/MemcachedTest.pm)" >&2
    exit 2
fi
src="$(cd "$src" && pwd)"
command -v perl >/dev/null || {
    echo "memcached-suite.sh: perl not found" >&2
    exit 2
}

if [[ -z $server ]]; then
    server="$root/target/release/kvcached"
    if [[ ! -x $server ]]; then
        (cd "$root" && cargo build --release --quiet -p kvcached) || exit 2
    fi
fi
[[ -x $server ]] || {
    echo "memcached-suite.sh: $server is not an executable" >&2
    exit 2
}
server="$(readlink -f "$server")"
kvcached=0
grep -q kvcached <<<"$("$server" -V 2>/dev/null || true)" && kvcached=1

work="$(mktemp -d /tmp/memcached-suite.XXXXXX)"
out=${keep:-$work/out}
mkdir -p "$out"
cleanup() {
    stop_servers
    rm -rf "$work"
}
trap cleanup EXIT

# The build directory: SOURCE's files, and the two programs the suite runs.
build="$work/build"
mkdir -p "$build"
for f in "$src"/* "$src"/.git; do
    [[ -e $f ]] || continue
    case ${f##*/} in memcached-debug | timedrun) continue ;; esac
    ln -s "$f" "$build/${f##*/}"
done
pids="$work/pids"
: >"$pids"
{
    echo '#!/bin/sh'
    echo "echo \$\$ >>'$pids'"
    if ((kvcached)); then
        echo "exec '$server' -o debug_clock \"\$@\""
    else
        echo "exec '$server' \"\$@\""
    fi
} >"$build/memcached-debug"
printf '#!/bin/sh\nshift\nexec "$@"\n' >"$build/timedrun"
chmod +x "$build/memcached-debug" "$build/timedrun"

# Stop the servers a file started that still run (only processes of this server binary
# whose ids the wrapper wrote).
stop_servers() {
    local pid
    while read -r pid; do
        [[ $(readlink "/proc/$pid/exe" 2>/dev/null) == "$server" ]] || continue
        kill -TERM "$pid" 2>/dev/null
        for _ in 1 2 3 4 5 6 7 8 9 10; do
            [[ -e /proc/$pid ]] || break
            sleep 0.2
        done
        kill -KILL "$pid" 2>/dev/null
    done <"$pids"
    : >"$pids"
}

# The files to run.
tests=()
if (($# > 0)); then
    for t in "$@"; do tests+=("${t%.t}"); done
else
    for f in "$src"/t/*.t; do
        t=${f##*/}
        tests+=("${t%.t}")
    done
fi

# What a file's TAP output says: the plan, the tests run, and one "NUMBER DESCRIPTION" line
# per failure (TODO tests are not failures). Nested subtests (indented) count through their
# parent's line.
tap() {
    awk '
        /^1\.\.[0-9]+/ && !plan { plan = $0; sub(/^1\.\./, "", plan); sub(/[^0-9].*/, "", plan)
                                  if ($0 ~ /# *[Ss][Kk][Ii][Pp]/) skip = 1 }
        /^ok [0-9]+/ { ran++ }
        /^not ok [0-9]+/ {
            ran++
            if ($0 ~ /# *TODO/) next
            line = $0; sub(/^not ok /, "", line)
            n = line; sub(/[^0-9].*/, "", n)
            d = substr(line, length(n) + 1); sub(/^ *(- )?/, "", d)
            fails = fails n (d == "" ? "" : " " d) "\n"
        }
        END { printf "%s %d %d\n%s", (plan == "" ? "-" : plan), ran, skip, fails }
    ' "$1"
}

passed=0
skipped=0
excepted=0
failed=0
failed_names=()
started=$SECONDS
cd "$build" || exit 2
for t in "${tests[@]}"; do
    log="$out/$t.out"
    if [[ ! -f t/$t.t ]]; then
        echo "FAILED   $t: no t/$t.t"
        failed=$((failed + 1))
        failed_names+=("$t")
        continue
    fi
    # This file's exceptions.
    whole=0
    stop=""
    listed=()
    if ((kvcached)); then
        for e in "${expected[@]}"; do
            [[ ${e%% *} == "$t" ]] || continue
            rest=${e#* }
            if [[ $rest == "*" ]]; then
                whole=1
            elif [[ $rest =~ ^([0-9]+)\+ ]]; then
                stop=${BASH_REMATCH[1]}
            else
                listed+=("$rest")
            fi
        done
    fi
    # A file whose every assertion is an exception only has to run; some of them wait for
    # a slab move that never comes, so they get a shorter time.
    mine=$limit
    ((whole && mine > 20)) && mine=20
    t0=$SECONDS
    stopped=0
    if [[ -n $stop ]]; then
        # Run it in the background and stop it once assertion $stop is reported (Test::More
        # writes each line as it goes).
        timeout -k 10 "$mine" perl "t/$t.t" >"$log" 2>&1 </dev/null &
        runner=$!
        while kill -0 "$runner" 2>/dev/null; do
            if grep -qE "^(not )?ok $stop( |\$)" "$log"; then
                kill -TERM "$runner" 2>/dev/null
                stopped=1
                break
            fi
            sleep 0.2
        done
        wait "$runner"
        rc=$?
    else
        timeout -k 10 "$mine" perl "t/$t.t" >"$log" 2>&1 </dev/null
        rc=$?
    fi
    stop_servers
    took=$((SECONDS - t0))
    ((verbose)) && cat "$log"
    {
        read -r plan ran skip
        mapfile -t fails
    } < <(tap "$log")
    why=""
    if ((stopped)); then
        ((ran == stop)) || why="stopped at $stop but ran $ran tests: update the list"
    elif [[ -n $stop ]] && ((ran > stop)); then
        why="listed as stopping at $stop, but it went on to $ran (exit status $rc): update the list"
    elif ((rc == 124 || rc == 137)); then
        why="ran out of time (${mine}s)"
    elif ((skip)) && [[ $plan == 0 ]]; then
        if ((rc == 0)); then
            printf 'skipped  %-24s %3ds  %s\n' "$t" "$took" "$(grep -m1 '^1\.\.0' "$log" | sed 's/^1\.\.0 *# *//')"
            skipped=$((skipped + 1))
            continue
        fi
        why="skipped, with exit status $rc"
    elif [[ $plan == - ]]; then
        why="no plan (exit status $rc)"
    elif ((ran != plan)); then
        why="ran $ran of $plan tests (exit status $rc)"
    elif ((rc != 0 && rc != ${#fails[@]} && !(rc == 254 && ${#fails[@]} > 254))); then
        why="exit status $rc"
    fi
    if ((whole)); then
        printf 'expected %-24s %3ds  (every assertion; %s)\n' "$t" "$took" \
            "${why:-${#fails[@]} failed of $ran}"
        excepted=$((excepted + 1))
        continue
    fi
    new=()
    for f in "${fails[@]}"; do
        hit=0
        for l in "${listed[@]}"; do [[ $f == "$l" ]] && hit=1 && break; done
        ((hit)) || new+=("$f")
    done
    gone=()
    for l in "${listed[@]}"; do
        hit=0
        for f in "${fails[@]}"; do [[ $f == "$l" ]] && hit=1 && break; done
        ((hit)) || gone+=("$l")
    done
    if [[ -z $why && ${#new[@]} -eq 0 && ${#gone[@]} -eq 0 ]]; then
        if ((stopped)); then
            printf 'expected %-24s %3ds  %d of %s tests, then stopped where it waits (listed)\n' \
                "$t" "$took" "$ran" "$plan"
            excepted=$((excepted + 1))
        elif ((${#fails[@]} == 0)); then
            printf 'ok       %-24s %3ds  %d tests\n' "$t" "$took" "$ran"
            passed=$((passed + 1))
        else
            printf 'expected %-24s %3ds  %d tests, the %d listed failing\n' "$t" "$took" "$ran" "${#fails[@]}"
            excepted=$((excepted + 1))
        fi
        continue
    fi
    printf 'FAILED   %-24s %3ds  %s\n' "$t" "$took" "${why:-${#new[@]} new failures}"
    for f in "${new[@]}"; do printf '           not ok %.150s\n' "$f"; done
    for l in "${gone[@]}"; do printf '           listed but passed: %.150s\n' "$l"; done
    # The failures' diagnostics (long values cut).
    grep -v '^ok ' "$log" | grep -v 'WARN kvcached' | cut -c1-200 | head -40 | sed 's/^/           | /'
    failed=$((failed + 1))
    failed_names+=("$t")
done

total=$((SECONDS - started))
summary="memcached-suite: $passed ok, $excepted with listed exceptions, $skipped skipped, $failed failed"
summary+=" of ${#tests[@]} files from $src in ${total}s"
((failed > 0)) && summary+="; failed: ${failed_names[*]}"
echo "$summary"
[[ -n $keep ]] && echo "memcached-suite: outputs in $keep"
((failed == 0))
