#!/usr/bin/env bash
# The flash tier under load, beside memcached's extstore (issue 43, item 4), in one run:
# capacity, p99 of GETs and CPU per GET at half of memcached's capacity, and flash bytes
# written per value byte set (write amplification).
#
# Both servers run at once with one worker thread on the server core, the same -m and each
# a flash file of SIZE in DIR (`-o ext_path=DIR/NAME:SIZE`; put DIR on the device to
# measure). Each is first warmed up with a look-aside load (get; on a miss, set) over KEYS
# keys with Zipf 0.99 popularity (WARMUP requests, the same seeded stream), so that its
# flash holds what it can of a working set many times -m. Then, on the load core:
#   1. capacity: the same load closed loop (CONNS connections, one request in flight each)
#      for SECONDS against each server: requests/s and GETs/s;
#   2. ROUNDS rounds, alternating which server goes first, of an open-loop Poisson load at
#      half of memcached's capacity for SECONDS: p50/p99 of GETs (kvblast's, from send time)
#      and the server's CPU (user + system, every thread: workers, flash I/O) per GET;
#   3. extstore_bytes_written over the value bytes set (cmd_set times the mean value size
#      of the misses kvblast measured: each set follows a miss of its key).
# Prints every run and the medians with kvcached/memcached ratios.
#
# usage: bench/flash_load.sh -d DIR [-f SIZE] [-m MB] [-k KEYS] [-v BYTES|etc] [-w WARMUP]
#                            [-D SECONDS] [-r ROUNDS] [-c CONNS] [-M "MEMCACHED ARGS"]
#                            [-- KVCACHED ARGS]
#   -v: every value BYTES long (32-byte keys; default 1024), or etc (Facebook ETC key and
#       value sizes, one value size per key)
#   -M: more arguments for memcached only (its extstore tuning, e.g. ext_item_size=64)
# The reference is $MEMCACHED (built with extstore: ../shared/ref/build.sh's is).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh

dir=
size=2g
mem=64
keys=640000
values=1024
warmup=3000000
duration=10
rounds=2
conns=50
mc_extra=()
usage="usage: $0 -d DIR [-f SIZE] [-m MB] [-k KEYS] [-v BYTES|etc] [-w WARMUP] [-D SECONDS] [-r ROUNDS] [-c CONNS] [-M ARGS]"
while getopts "d:f:m:k:v:w:D:r:c:M:" opt; do
    case $opt in
        d) dir=$OPTARG ;;
        f) size=$OPTARG ;;
        m) mem=$OPTARG ;;
        k) keys=$OPTARG ;;
        v) values=$OPTARG ;;
        w) warmup=$OPTARG ;;
        D) duration=$OPTARG ;;
        r) rounds=$OPTARG ;;
        c) conns=$OPTARG ;;
        M) read -r -a mc_extra <<<"$OPTARG" ;;
        *) echo "$usage" >&2; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
kv_extra=("$@")
[ -n "$dir" ] || { echo "$usage" >&2; exit 2; }
if [ "$values" = etc ]; then
    workload=(--workload etc --value-size-per-key)
else
    workload=(--workload fixedsize --key-size 32 --value-size "$values" --value-size-per-key)
fi
load=("${workload[@]}" --keys "$keys" --popularity zipf:0.99 --look-aside)

bench_binaries
# (The help is taken whole first: with pipefail, `cmd | grep -q` fails when grep stops
# reading early and cmd dies of SIGPIPE.)
if ! grep -q ext_path <<<"$("$memcached" -h 2>&1 || true)"; then
    echo "flash_load.sh: $memcached was built without extstore" >&2
    exit 1
fi
mkdir -p "$dir"
tmp=$(mktemp -d)
hz=$(getconf CLK_TCK)
declare -A port pid
cleanup() {
    kill "${pid[@]}" 2>/dev/null || true
    wait 2>/dev/null || true
    rm -rf "$tmp"
    rm -f "$dir/memcached-ext" "$dir/kvcached-ext"
}
trap cleanup EXIT

start() { # NAME
    local name=$1
    port[$name]=$(free_port)
    if [ "$name" = memcached ]; then
        taskset -c "$server_core" "$memcached" "${user_args[@]}" -l 127.0.0.1 -p "${port[$name]}" \
            -t 1 -m "$mem" -o "ext_path=$dir/memcached-ext:$size" "${mc_extra[@]}" &
    else
        taskset -c "$server_core" "$kvcached" "${user_args[@]}" -l 127.0.0.1 -p "${port[$name]}" \
            -t 1 -m "$mem" -U 0 -o "ext_path=$dir/kvcached-ext:$size" "${kv_extra[@]}" &
    fi
    pid[$name]=$!
    wait_port "${port[$name]}"
    taskset -c "$load_core" "$kvblast" run -q --no-server-stats "${load[@]}" -c 16 -d 4 --seed 7 \
        -n "$warmup" -D 900s "127.0.0.1:${port[$name]}" >/dev/null
}

echo "flash files: $dir ($(df -h --output=source,fstype "$dir" | tail -1 | tr -s ' ')), $size each; -m $mem"
echo "memcached: $("$memcached" -V) ($memcached) ${mc_extra[*]}; kvcached: $("$kvcached" -V) ${kv_extra[*]}; $(nproc) cores"
echo "look-aside, ${workload[*]}, $keys keys, Zipf 0.99; $warmup warm-up requests each"
start memcached
start kvcached

# get_stats JSON: "rate get_rate gets p50 p99 fell_behind mean_value" of a kvblast run.
get_stats() {
    python3 - "$1" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
a, g = d["ops"]["all"], d["ops"]["get"]
mean = g["miss_bytes"] / g["misses"] if g.get("misses") else 0
print(f"{a['rate']:.0f} {g['rate']:.0f} {g['count']} {g['p50_us']:.1f} {g['p99_us']:.1f} "
      f"{d['fell_behind']} {mean:.1f}")
PY
}

declare -A capacity
for s in memcached kvcached; do
    taskset -c "$load_core" "$kvblast" run -q --no-server-stats "${load[@]}" -c "$conns" --seed 9 \
        -D "${duration}s" --json "$tmp/cap-$s.json" "127.0.0.1:${port[$s]}" >/dev/null
    read -r rate get_rate _ <<<"$(get_stats "$tmp/cap-$s.json")"
    capacity[$s]=$rate
    echo "$s closed-loop capacity: $rate requests/s ($get_rate GETs/s), $conns connections"
done
half=$((capacity[memcached] / 2))
echo "open loop at half of memcached's capacity: $half requests/s, ${duration}s per run"
printf '%-10s %6s %10s %10s %10s %10s %12s %8s\n' server round req/s gets p50_us p99_us cpu_us/get behind
for round in $(seq 1 "$rounds"); do
    order=(memcached kvcached)
    [ $((round % 2)) -eq 0 ] && order=(kvcached memcached)
    for s in "${order[@]}"; do
        t0=$(cpu_ticks "${pid[$s]}")
        taskset -c "$load_core" "$kvblast" run -q --no-server-stats "${load[@]}" -c "$conns" \
            --seed $((10 + round)) --rate "$half" -D "${duration}s" --json "$tmp/$s-$round.json" \
            "127.0.0.1:${port[$s]}" >/dev/null
        t1=$(cpu_ticks "${pid[$s]}")
        read -r rate _ gets p50 p99 behind _ <<<"$(get_stats "$tmp/$s-$round.json")"
        cpu=$(python3 -c "print(f'{($t1 - $t0) / $hz / max($gets, 1) * 1e6:.2f}')")
        echo "$s $round $rate $gets $p50 $p99 $cpu $behind" >>"$tmp/rows"
        printf '%-10s %6s %10s %10s %10s %10s %12s %8s\n' "$s" "$round" "$rate" "$gets" "$p50" "$p99" "$cpu" "$behind"
    done
done

declare -A written sets
for s in memcached kvcached; do
    written[$s]=$(stat "${port[$s]}" extstore_bytes_written)
    sets[$s]=$(stat "${port[$s]}" cmd_set)
done
python3 - "$tmp" "${capacity[memcached]}" "${capacity[kvcached]}" "${written[memcached]}" \
    "${written[kvcached]}" "${sets[memcached]}" "${sets[kvcached]}" <<'PY'
import json, statistics, sys
tmp = sys.argv[1]
cap = {"memcached": float(sys.argv[2]), "kvcached": float(sys.argv[3])}
written = {"memcached": int(sys.argv[4]), "kvcached": int(sys.argv[5])}
sets = {"memcached": int(sys.argv[6]), "kvcached": int(sys.argv[7])}
rows = [l.split() for l in open(f"{tmp}/rows")]
med = {}
for s in ("memcached", "kvcached"):
    rs = [r for r in rows if r[0] == s]
    med[s] = {k: statistics.median(float(r[i]) for r in rs) for k, i in (("p50", 4), ("p99", 5), ("cpu", 6))}
# The mean value size set: that of the misses measured (each set refills a miss).
g = json.load(open(f"{tmp}/cap-memcached.json"))["ops"]["get"]
mean = g["miss_bytes"] / g["misses"] if g.get("misses") else 0
r = lambda k: med["kvcached"][k] / med["memcached"][k] if med["memcached"][k] else float("nan")
print(f"capacity: memcached {cap['memcached']:.0f}, kvcached {cap['kvcached']:.0f} requests/s "
      f"({cap['kvcached'] / cap['memcached']:.2f})")
print(f"median at half of memcached's capacity: GET p50 memcached {med['memcached']['p50']:.1f} µs, "
      f"kvcached {med['kvcached']['p50']:.1f} ({r('p50'):.2f}); p99 {med['memcached']['p99']:.1f}, "
      f"{med['kvcached']['p99']:.1f} ({r('p99'):.2f}); CPU per GET {med['memcached']['cpu']:.2f} µs, "
      f"{med['kvcached']['cpu']:.2f} ({r('cpu'):.2f})")
for s in ("memcached", "kvcached"):
    stored = sets[s] * mean
    wa = written[s] / stored if stored else float("nan")
    print(f"{s}: extstore_bytes_written {written[s]}, cmd_set {sets[s]} x {mean:.0f} value bytes: "
          f"{wa:.2f} flash bytes per value byte set")
PY
