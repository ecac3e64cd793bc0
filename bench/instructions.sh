#!/usr/bin/env bash
# Instructions per GET on the server's worker thread, counted by callgrind: a repeatable
# micro-benchmark for changes to the request path (instruction counts do not move with the
# machine's load the way timings do). Compares two or more kvcached builds in one run.
# (memcached 1.6.45 does not start under valgrind here: it cannot raise its descriptor
# limit past valgrind's, whatever -c is given.)
#
#   bench/instructions.sh [-n GETS] [-k KEYS] [-d DEPTH] [-c CONNS] [LABEL=]BINARY...
#
#   git worktree add /tmp/old HEAD~1 && (cd /tmp/old && cargo build --release -p kvcached)
#   bench/instructions.sh before=/tmp/old/target/release/kvcached after=target/release/kvcached
#
# For each binary: start it under `valgrind --tool=callgrind --separate-threads=yes` with
# one worker (-t 1 -m 256 -c 512, and -o no_lru_crawler for kvcached), set
# KEYS keys of 32 bytes (32-byte values), zero the counters, send GETS GETs from kvblast
# (all hits, DEPTH in flight on each of CONNS connections), dump the counters, and divide
# the busiest thread's instructions by GETS. Prints one line per binary and the ratio to
# the first. Needs valgrind (callgrind_control) and a release kvblast.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
gets=100000
keys=20000
depth=1
conns=10
while getopts "n:k:d:c:" opt; do
    case "$opt" in
    n) gets="$OPTARG" ;;
    k) keys="$OPTARG" ;;
    d) depth="$OPTARG" ;;
    c) conns="$OPTARG" ;;
    *)
        sed -n '2,20p' "$0" >&2
        exit 2
        ;;
    esac
done
shift $((OPTIND - 1))
(($# > 0)) || {
    sed -n '2,20p' "$0" >&2
    exit 2
}
command -v callgrind_control >/dev/null || {
    echo "instructions.sh: valgrind missing (apt-get install valgrind)" >&2
    exit 1
}
kvblast="$root/target/release/kvblast"
[[ -x $kvblast ]] || (cd "$root" && cargo build --release --quiet -p kvblast)

work="$(mktemp -d)"
pid=
cleanup() {
    [[ -n $pid ]] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
    [[ -n ${KEEP:-} ]] && echo "kept $work" >&2 || rm -rf "$work"
}
trap cleanup EXIT

# free_port, stat and wait_port.
# shellcheck source=bench/lib.sh
source "$root/bench/lib.sh"

first=
printf '%-12s %12s %10s  %s\n' "server" "instr/GET" "ratio" "binary"
for spec in "$@"; do
    label="${spec%%=*}"
    bin="${spec#*=}"
    [[ $label == "$spec" ]] && label="$(basename "$bin")"
    [[ -x $bin ]] || {
        echo "instructions.sh: $bin is not executable" >&2
        exit 1
    }
    port="$(free_port)"
    args=(-t 1 -m 256 -c 512 -l 127.0.0.1 -p "$port")
    grep -q kvcached <<<"$("$bin" -V 2>/dev/null)" && args+=(-o no_lru_crawler)
    args+=("${user_args[@]}")
    out="$work/$label"
    mkdir -p "$out"
    valgrind --tool=callgrind --separate-threads=yes --callgrind-out-file="$out/cg.%p" \
        "$bin" "${args[@]}" >/dev/null 2>"$out/valgrind.log" &
    pid=$!
    wait_port "$port" 120 # valgrind starts slowly
    "$kvblast" run -q --no-server-stats --workload fixedsize --keys "$keys" --key-size 32 \
        --value-size 32 --popularity sequential --mix set=1 -n "$keys" -c 1 -d 16 \
        "127.0.0.1:$port" >/dev/null
    hits_before="$(stat "$port" get_hits)"
    callgrind_control -z "$pid" >/dev/null 2>&1
    "$kvblast" run -q --no-server-stats --workload fixedsize --keys "$keys" --key-size 32 \
        --value-size 32 --popularity uniform --mix get=1 -n "$gets" -c "$conns" -d "$depth" \
        "127.0.0.1:$port" >/dev/null
    callgrind_control -d "$pid" >/dev/null 2>&1
    hits="$(($(stat "$port" get_hits) - hits_before))"
    # A server under valgrind may take long to stop (or not stop) on SIGTERM: the counts
    # are dumped already, so give it a few seconds, then kill it.
    kill "$pid"
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    pid=
    # The busiest thread's instructions (the worker), from the dump taken after the GETs.
    instr="$(python3 - "$out" <<'EOF'
import glob, re, sys
best = 0
# The dump callgrind_control -d took is part 1: one file per thread, cg.PID.1-THREAD.
for f in glob.glob(sys.argv[1] + "/cg.*.1-*"):
    m = re.search(r"^totals:\s+(\d+)", open(f, errors="replace").read(), re.M)
    if m:
        best = max(best, int(m.group(1)))
print(best)
EOF
)"
    per=$(python3 -c "print(round($instr / $gets))")
    if [[ -z $first ]]; then
        first=$per
    fi
    ratio=$(python3 -c "print(f'{$per / $first:.3f}')")
    printf '%-12s %12s %10s  %s (get_hits %s of %s GETs)\n' "$label" "$per" "$ratio" "$bin" \
        "$hits" "$gets"
done
