#!/usr/bin/env bash
# Hit ratio at equal memory, kvcached next to Debian's memcached, in one run.
#
# Look-aside workload (get; on a miss, set), Zipf popularity over KEYS keys, Facebook ETC
# key and value sizes (kvblast's etc workload), a key space several times larger than -m
# holds. Each server gets the same seeded request streams, counted in requests so that a
# faster server gets no longer warm-up: WARMUP requests that are not counted, then MEASURE
# requests; the hit ratio is kvblast's count of get hits over gets in the measured run.
# Reports both miss ratios and kvcached's miss ratio over memcached's.
#
# usage: bench/hitratio.sh [-m MEGABYTES] [-k KEYS] [-w WARMUP] [-n MEASURE] [-a "0.99 0.8"]
#                          [-- KVCACHED ARGS]
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh

mem=64
keys=2000000
warmup=4000000
measure=2000000
alphas="0.99 0.8"
while getopts "m:k:w:n:a:" opt; do
    case $opt in
        m) mem=$OPTARG ;;
        k) keys=$OPTARG ;;
        w) warmup=$OPTARG ;;
        n) measure=$OPTARG ;;
        a) alphas=$OPTARG ;;
        *) echo "usage: $0 [-m MB] [-k KEYS] [-w WARMUP] [-n MEASURE] [-a ALPHAS]" >&2; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
kv_extra=("$@")

cargo build --release -q -p kvcached -p kvblast
memcached=${MEMCACHED:-/usr/bin/memcached}
server_core=1
load_core=0
json=$(mktemp)
trap 'rm -f "$json"' EXIT


echo "look-aside, etc sizes, $keys keys, -m $mem, 1 worker thread; $warmup warm-up requests, $measure measured; $(nproc) cores"
echo "memcached: $("$memcached" -V); kvcached: $(target/release/kvcached -V) ${kv_extra[*]}"
printf '%-6s %-10s %12s %10s %10s\n' alpha server gets hit_ratio miss_ratio
for alpha in $alphas; do
    declare -A miss=()
    for server in memcached kvcached; do
        port=$(free_port)
        if [ $server = memcached ]; then
            taskset -c $server_core "$memcached" "${user_args[@]}" -l 127.0.0.1 -p "$port" -t 1 -m "$mem" &
        else
            taskset -c $server_core target/release/kvcached "${user_args[@]}" -l 127.0.0.1 -p "$port" \
                -t 1 -m "$mem" "${kv_extra[@]}" &
        fi
        pid=$!
        wait_port "$port"
        for phase in warmup measure; do
            n=$warmup seed=7
            [ $phase = measure ] && n=$measure seed=8
            taskset -c $load_core target/release/kvblast run -q --no-server-stats --workload etc \
                --keys "$keys" --popularity "zipf:$alpha" --look-aside -c 16 -d 4 --seed $seed \
                -n "$n" -D 600s --json "$json" "127.0.0.1:$port" >/dev/null
        done
        kill $pid; wait $pid 2>/dev/null || true
        read -r gets ratio < <(python3 -c "
import json
g = json.load(open('$json'))['ops']['get']
n = g['hits'] + g['misses']
print(n, g['hits'] / max(n, 1))")
        miss[$server]=$(python3 -c "print(1 - $ratio)")
        printf '%-6s %-10s %12s %10.4f %10.4f\n' "$alpha" "$server" "$gets" "$ratio" "${miss[$server]}"
    done
    python3 -c "print(f'alpha $alpha: kvcached miss ratio / memcached miss ratio = {${miss[kvcached]} / ${miss[memcached]}:.3f}')"
done
