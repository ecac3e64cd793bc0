#!/usr/bin/env bash
# Hit ratio at equal memory: kvcached next to a reference memcached, in one run.
#
# Look-aside workload (get; on a miss, set), Zipf popularity over KEYS keys, Facebook ETC
# key and value sizes (kvblast's etc workload), a key space several times larger than -m
# holds. Each key has one value size (kvblast --value-size-per-key), as a real key's value
# keeps its size; -S draws a fresh size at every set instead (kvblast's default, and this
# script's before 2026-11-26), which flatters a policy that favours small items: a key
# evicted with a large value may come back with a small one.
#
# Each server gets the same seeded request streams, counted in requests so that a faster
# server gets no longer warm-up: WARMUP requests that are not counted, then MEASURE
# requests. The miss ratio is kvblast's count of get misses over gets in the measured
# run; the byte miss ratio the value bytes of those misses over all value bytes asked for
# (per-key sizes only). ROUNDS rounds per alpha, alternating which server goes first;
# prints every round, then each server's medians and kvcached's over memcached's.
#
# usage: bench/hitratio.sh [-m MEGABYTES] [-k KEYS] [-w WARMUP] [-n MEASURE] [-a "0.99 0.8"]
#                          [-r ROUNDS] [-S] [-v BYTES] [-M "MEMCACHED ARGS"] [-- KVCACHED ARGS]
# -v BYTES: every value that size (kvblast's fixedsize workload, 32-byte keys) instead of
# ETC sizes. -M: arguments for memcached only (bench/flash.sh gives each its flash file).
# The reference server is $MEMCACHED (default Debian's /usr/bin/memcached); $KVCACHED
# replaces the kvcached built here.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh

mem=64
keys=2000000
warmup=4000000
measure=2000000
alphas="0.99 0.8"
rounds=1
sizes=(--value-size-per-key)
workload=(--workload etc)
mc_extra=()
while getopts "m:k:w:n:a:r:Sv:M:" opt; do
    case $opt in
        m) mem=$OPTARG ;;
        k) keys=$OPTARG ;;
        w) warmup=$OPTARG ;;
        n) measure=$OPTARG ;;
        a) alphas=$OPTARG ;;
        r) rounds=$OPTARG ;;
        S) sizes=() ;;
        v) workload=(--workload fixedsize --key-size 32 --value-size "$OPTARG") sizes=() ;;
        M) read -r -a mc_extra <<<"$OPTARG" ;;
        *) echo "usage: $0 [-m MB] [-k KEYS] [-w WARMUP] [-n MEASURE] [-a ALPHAS] [-r ROUNDS] [-S] [-v BYTES] [-M ARGS]" >&2; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
kv_extra=("$@")

bench_binaries
json=$(mktemp)
results=$(mktemp)
trap 'rm -f "$json" "$results"' EXIT

echo "look-aside, ${workload[*]}$([ ${#sizes[@]} -gt 0 ] && echo ", one value size per key"), $keys keys, -m $mem, 1 worker thread; $warmup warm-up requests, $measure measured; $rounds round(s); $(nproc) cores"
echo "memcached: $("$memcached" -V) ($memcached) ${mc_extra[*]}; kvcached: $("$kvcached" -V) ${kv_extra[*]}"
printf '%-6s %-5s %-10s %12s %10s %10s %10s\n' alpha round server gets hit_ratio miss_ratio byte_miss

# one ALPHA ROUND SERVER: a fresh server, the warm-up, the measured run; appends a result line.
one() {
    local alpha=$1 round=$2 server=$3 port pid
    port=$(free_port)
    if [ "$server" = memcached ]; then
        taskset -c "$server_core" "$memcached" "${user_args[@]}" -l 127.0.0.1 -p "$port" -t 1 -m "$mem" \
            "${mc_extra[@]}" &
    else
        taskset -c "$server_core" "$kvcached" "${user_args[@]}" -l 127.0.0.1 -p "$port" \
            -t 1 -m "$mem" "${kv_extra[@]}" &
    fi
    pid=$!
    wait_port "$port"
    for phase in warmup measure; do
        n=$warmup seed=7
        [ $phase = measure ] && n=$measure seed=8
        taskset -c "$load_core" "$kvblast" run -q --no-server-stats "${workload[@]}" "${sizes[@]}" \
            --keys "$keys" --popularity "zipf:$alpha" --look-aside -c 16 -d 4 --seed $seed \
            -n "$n" -D 600s --json "$json" "127.0.0.1:$port" >/dev/null
    done
    kill $pid; wait $pid 2>/dev/null || true
    python3 - "$json" "$alpha" "$round" "$server" <<'PY' | tee -a "$results"
import json, sys
g = json.load(open(sys.argv[1]))['ops']['get']
n = g['hits'] + g['misses']
b = g.get('hit_bytes', 0) + g.get('miss_bytes', 0)
byte_miss = f"{g['miss_bytes'] / b:.4f}" if b else "-"
print(f"{sys.argv[2]:<6} {sys.argv[3]:<5} {sys.argv[4]:<10} {n:>12} {g['hits'] / max(n, 1):>10.4f} "
      f"{g['misses'] / max(n, 1):>10.4f} {byte_miss:>10}")
PY
}

for alpha in $alphas; do
    for round in $(seq 1 "$rounds"); do
        order="memcached kvcached"
        [ $((round % 2)) -eq 0 ] && order="kvcached memcached"
        for server in $order; do
            one "$alpha" "$round" "$server"
        done
    done
done

echo
python3 - "$results" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
med = {}
for alpha in dict.fromkeys(r[0] for r in rows):
    for server in ("memcached", "kvcached"):
        rs = [r for r in rows if r[0] == alpha and r[2] == server]
        miss = statistics.median(float(r[5]) for r in rs)
        bm = [float(r[6]) for r in rs if r[6] != "-"]
        med[alpha, server] = (miss, statistics.median(bm) if bm else None)
    (m, mb), (k, kb) = med[alpha, "memcached"], med[alpha, "kvcached"]
    line = f"alpha {alpha}: median miss ratio memcached {m:.4f}, kvcached {k:.4f}: kvcached / memcached = {k / m:.3f}"
    if mb and kb:
        line += f"; byte miss ratio {mb:.4f}, {kb:.4f}: {kb / mb:.3f}"
    print(line)
PY
