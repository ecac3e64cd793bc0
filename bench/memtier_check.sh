#!/usr/bin/env bash
# Cross-check of kvblast's closed-loop figures against memtier_benchmark (issue 13): the
# same load from each generator against the same servers, in one run. The load: 50
# connections, one request in flight on each, 1 set for every 10 gets, 32-byte values,
# keys drawn uniformly from 100,000 (set by a load phase first). Each server runs one
# worker pinned to core 0; the generator runs on core 1 with one thread. ROUNDS rounds,
# each running memtier then kvblast against memcached then kvcached (the order reversed
# every other round). Prints every run's requests/s and mean latency as the generator
# reports them, the server's own count (cmd_get + cmd_set over the run's wall time) and how
# busy the server's core was, then the medians and kvblast/memtier per server.
#
#   MEMCACHED=PATH MEMTIER=PATH [KVCACHED=PATH] bench/memtier_check.sh [-d SECONDS] [-r ROUNDS]
#
# MEMCACHED defaults to /usr/bin/memcached and MEMTIER to memtier_benchmark on the PATH
# (the reference build puts both under ~/.cache/kvcache-ref).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh

duration=10
rounds=3
while getopts "d:r:" opt; do
    case $opt in
        d) duration=$OPTARG ;;
        r) rounds=$OPTARG ;;
        *) echo "usage: $0 [-d SECONDS] [-r ROUNDS]" >&2; exit 2 ;;
    esac
done
cargo build --release -q -p kvcached -p kvblast
target=${CARGO_TARGET_DIR:-target}
kvcached=${KVCACHED:-$target/release/kvcached}
kvblast=$target/release/kvblast
memcached=${MEMCACHED:-/usr/bin/memcached}
memtier=${MEMTIER:-memtier_benchmark}
command -v "$memtier" >/dev/null || { echo "no memtier_benchmark (set MEMTIER)" >&2; exit 2; }
mc_version=$("$memcached" -V | awk '{print $2}')
mt_version=$("$memtier" --version | head -1 | awk '{print $2}')
user=(); [ "$(id -u)" = 0 ] && user=(-u root)
pid=""
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null || true' EXIT
tmp=$(mktemp -d)

echo "machine: $(nproc) cores; $(uname -r); $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
echo "memcached $mc_version ($memcached); memtier_benchmark $mt_version; kvblast $("$kvblast" --version | awk '{print $2}')"

start_server() { # start_server NAME PORT
    local port=$2
    case $1 in
        memcached) taskset -c 0 "$memcached" "${user[@]}" -l 127.0.0.1 -p "$port" -U 0 -t 1 -m 1024 -c 1024 >/dev/null 2>&1 & ;;
        kvcached) taskset -c 0 "$kvcached" "${user[@]}" -l 127.0.0.1 -p "$port" -U 0 -t 1 -m 1024 >/dev/null 2>&1 & ;;
    esac
    pid=$!
    wait_port "$port"
    # The keys each generator reads, 100,000 of them with 32-byte values: kvblast's (9-digit
    # numbers) by its load phase, memtier's (key:N) by a fill run.
    taskset -c 1 "$kvblast" run -q --no-server-stats -w fixedsize --key-size 9 --value-size 32 \
        --keys 100000 --load --mix get=1 -c 10 -D 1s "127.0.0.1:$port" >/dev/null
    taskset -c 1 "$memtier" -s 127.0.0.1 -p "$port" -P memcache_text -t 1 -c 1 --ratio=1:0 \
        -d 32 --key-prefix=key: --key-minimum=1 --key-maximum=100000 --key-pattern=P:P \
        -n allkeys --hide-histogram >/dev/null 2>&1
}
stop_server() { kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; pid=""; }

run_memtier() { # run_memtier PORT: prints "requests/s mean_ms"
    taskset -c 1 "$memtier" -s 127.0.0.1 -p "$1" -P memcache_text -t 1 -c 50 --pipeline=1 \
        --ratio=1:10 -d 32 --key-prefix=key: --key-minimum=1 --key-maximum=100000 \
        --key-pattern=R:R --distinct-client-seed --test-time="$duration" --hide-histogram \
        --out-file="$tmp/memtier.txt" >/dev/null 2>&1
    awk '/^Totals/ {print $2, $5; exit}' "$tmp/memtier.txt"
}
run_kvblast() { # run_kvblast PORT: prints "requests/s mean_ms"
    taskset -c 1 "$kvblast" run -q --no-server-stats -w fixedsize --key-size 9 --value-size 32 \
        --keys 100000 --mix get=10,set=1 -c 50 -D "${duration}s" --json "$tmp/kvblast.json" \
        "127.0.0.1:$1" >/dev/null
    python3 -c 'import json,sys
r = json.load(open(sys.argv[1]))
a = r["ops"]["all"]
print(round(a["count"] / r["seconds"]), round(a["mean_us"] / 1000, 5))' "$tmp/kvblast.json"
}

declare -A results
for r in $(seq "$rounds"); do
    servers=(memcached kvcached)
    [ $((r % 2)) = 0 ] && servers=(kvcached memcached)
    for server in "${servers[@]}"; do
        port=$(free_port)
        start_server "$server" "$port"
        for gen in memtier kvblast; do
            g0=$(stat "$port" cmd_get); s0=$(stat "$port" cmd_set); c0=$(cpu_ticks "$pid")
            t0=$(date +%s.%N)
            out=$("run_$gen" "$port")
            t1=$(date +%s.%N)
            g1=$(stat "$port" cmd_get); s1=$(stat "$port" cmd_set); c1=$(cpu_ticks "$pid")
            hz=$(getconf CLK_TCK)
            served=$(python3 -c "print(round(($g1-$g0+$s1-$s0)/($t1-$t0)))")
            busy=$(python3 -c "print(round(100*($c1-$c0)/$hz/($t1-$t0)))")
            echo "round $r $server $gen: $(awk '{print $1}' <<<"$out") req/s, mean $(awk '{print $2}' <<<"$out") ms; server counted $served req/s over the whole run, core ${busy}% busy"
            results[$server.$gen]+="$(awk '{print $1}' <<<"$out") "
        done
        stop_server
    done
done
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
for server in memcached kvcached; do
    # shellcheck disable=SC2086
    m=$(median ${results[$server.memtier]}); k=$(median ${results[$server.kvblast]})
    echo "median $server: memtier $m req/s, kvblast $k req/s, kvblast/memtier $(python3 -c "print(round($k/$m, 3))")"
done
