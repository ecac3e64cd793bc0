#!/usr/bin/env bash
# Hit ratio with times to live, kvcached next to a reference memcached, in one run.
#
# Look-aside (get; on a miss, set) at a fixed open-loop rate, Facebook ETC key and value
# sizes, Zipf popularity over KEYS keys, every set with a time to live drawn uniformly
# from 1 to 60 s (`--exptime 1 --exptime-max 60`; -T MIN-MAX for another range), more data
# per minute than -m holds. With -W SECONDS the load runs that long first, not counted
# (kvblast --warmup), so the figures leave out the cold start's misses, which every server
# has.
# Both servers see the same seeded request stream for the same time, so the same items
# expire; what differs is how soon each gives the memory of expired items to live ones
# (kvcached: TTL classes and whole-segment expiry; memcached: its LRU crawler). Rounds
# alternate which server goes first. Reports each round's get hit ratio, the medians, the
# ratio of kvcached's miss ratio to memcached's, and the servers' expiry counters. Each
# key has one value size (kvblast --value-size-per-key), so a byte miss ratio is reported
# too; -S draws a size at every set instead (as before 2026-11-26).
#
# The reference is $MEMCACHED (default /usr/bin/memcached); its version is in the output.
# $KVCACHED runs another kvcached binary (an older build, say) instead of this tree's.
#
# usage: bench/expiry.sh [-m MEGABYTES] [-k KEYS] [-R RATE] [-D SECONDS] [-r ROUNDS] [-a ALPHA]
#                        [-T MIN-MAX] [-W SECONDS] [-S]
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh

mem=64
keys=2000000
rate=40000
secs=60
rounds=3
alpha=0.99
sizes=(--value-size-per-key)
ttl=1-60
warm=0
while getopts "m:k:R:D:r:a:T:W:S" opt; do
    case $opt in
        m) mem=$OPTARG ;;
        k) keys=$OPTARG ;;
        R) rate=$OPTARG ;;
        D) secs=$OPTARG ;;
        r) rounds=$OPTARG ;;
        a) alpha=$OPTARG ;;
        T) ttl=$OPTARG ;;
        W) warm=$OPTARG ;;
        S) sizes=() ;;
        *) echo "usage: $0 [-m MB] [-k KEYS] [-R RATE] [-D SECONDS] [-r ROUNDS] [-a ALPHA] [-T MIN-MAX] [-W SECONDS] [-S]" >&2; exit 2 ;;
    esac
done
ttl_min=${ttl%-*}
ttl_max=${ttl#*-}

cargo build --release -q -p kvcached -p kvblast
memcached=${MEMCACHED:-/usr/bin/memcached}
kvcached=${KVCACHED:-target/release/kvcached}
server_core=1
load_core=0
json=$(mktemp)
results=$(mktemp)
trap 'rm -f "$json" "$results"' EXIT

echo "look-aside at $rate req/s for ${secs} s after ${warm} s of warm-up, etc sizes$([ ${#sizes[@]} -gt 0 ] && echo " (one per key)"), zipf:$alpha over $keys keys, TTL $ttl_min-$ttl_max s, -m $mem, 1 worker thread; $(nproc) cores"
echo "memcached: $("$memcached" -V); kvcached: $("$kvcached" -V) ($kvcached)"

# one SERVER ROUND: run the load against a fresh server, append a row to $results.
one() {
    local server=$1 round=$2 port pid
    port=$(free_port)
    if [ "$server" = memcached ]; then
        taskset -c $server_core "$memcached" "${user_args[@]}" -l 127.0.0.1 -p "$port" -t 1 -m "$mem" &
    else
        taskset -c $server_core "$kvcached" "${user_args[@]}" -l 127.0.0.1 -p "$port" -t 1 -m "$mem" &
    fi
    pid=$!
    wait_port "$port"
    taskset -c $load_core target/release/kvblast run -q --no-server-stats --workload etc "${sizes[@]}" \
        --keys "$keys" --popularity "zipf:$alpha" --look-aside --exptime "$ttl_min" --exptime-max "$ttl_max" \
        --rate "$rate" -c 16 --seed 7 --warmup "${warm}s" -D "${secs}s" --json "$json" "127.0.0.1:$port" >/dev/null
    local reclaimed crawler evictions segments
    reclaimed=$(stat "$port" reclaimed)
    crawler=$(stat "$port" crawler_reclaimed)
    evictions=$(stat "$port" evictions)
    segments=$(stat "$port" segments_expired slabs)
    kill $pid; wait $pid 2>/dev/null || true
    python3 - "$json" "$server" "$round" "$reclaimed" "$crawler" "$evictions" "${segments:--}" >>"$results" <<'PY'
import json, sys
g = json.load(open(sys.argv[1]))['ops']['get']
n = g['hits'] + g['misses']
b = g.get('hit_bytes', 0) + g.get('miss_bytes', 0)
byte_miss = f"{g['miss_bytes'] / b:.4f}" if b else "-"
print(sys.argv[2], sys.argv[3], n, g['hits'] / max(n, 1), *sys.argv[4:], byte_miss)
PY
    tail -n 1 "$results"
}

echo "server round gets hit_ratio reclaimed crawler_reclaimed evictions segments_expired byte_miss"
for round in $(seq 1 "$rounds"); do
    if [ $((round % 2)) = 1 ]; then order="memcached kvcached"; else order="kvcached memcached"; fi
    for server in $order; do one "$server" "$round"; done
done
python3 - "$results" "$($memcached -V | awk '{print $2}')" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
hit = {s: statistics.median(float(r[3]) for r in rows if r[0] == s) for s in ("kvcached", "memcached")}
print(f"median hit ratio: kvcached {hit['kvcached']:.4f}, memcached {sys.argv[2]} {hit['memcached']:.4f}")
print(f"kvcached miss ratio / memcached miss ratio = {(1 - hit['kvcached']) / (1 - hit['memcached']):.3f}")
bm = {s: [float(r[8]) for r in rows if r[0] == s and r[8] != "-"] for s in hit}
if all(bm.values()):
    k, m = statistics.median(bm["kvcached"]), statistics.median(bm["memcached"])
    print(f"median byte miss ratio: kvcached {k:.4f}, memcached {m:.4f}: kvcached / memcached = {k / m:.3f}")
PY
