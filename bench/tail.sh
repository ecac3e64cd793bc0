#!/usr/bin/env bash
# Tail latency at a fixed fraction of memcached's capacity, kvcached beside memcached
# ($MEMCACHED), in one run.
#
# Both servers run with one worker thread on core 1; kvblast runs on core 0. First a closed-loop
# run of the workload against memcached (depth 1, CONNS connections) gives its capacity; then
# ROUNDS rounds, alternating which server goes first, of an open-loop Poisson load at FRACTION
# of that capacity against each server for SECONDS. It prints each run's p50, p99 and p99.9
# (kvblast's, in µs, from send time: queueing included) and the medians' kvcached/memcached
# ratios. Runs whose generator fell behind its schedule are marked: their tail is the
# generator's, not the server's. FRACTION 0 runs closed loop instead (one request in flight
# per connection, as fast as each server answers: the latency of a saturated server).
#
# usage: bench/tail.sh [-D SECONDS] [-r ROUNDS] [-c CONNS] [-f FRACTION] [-- KVBLAST ARGS]
#   KVBLAST ARGS replace the default workload (--workload usr --keys 100000).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh

duration=10
rounds=3
conns=50
fraction=0.5
while getopts "D:r:c:f:" opt; do
    case $opt in
        D) duration=$OPTARG ;;
        r) rounds=$OPTARG ;;
        c) conns=$OPTARG ;;
        f) fraction=$OPTARG ;;
        *) echo "usage: $0 [-D SECONDS] [-r ROUNDS] [-c CONNS] [-f FRACTION] [-- KVBLAST ARGS]" >&2; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
workload=("$@")
[ ${#workload[@]} -gt 0 ] || workload=(--workload usr --keys 100000)

bench_binaries
dir=$(mktemp -d)

declare -A port pid
start() { # NAME BINARY
    port[$1]=$(free_port)
    taskset -c $server_core "$2" "${user_args[@]}" -l 127.0.0.1 -p "${port[$1]}" -t 1 -m 256 &
    pid[$1]=$!
    wait_port "${port[$1]}"
    "$kvblast" run -q --no-server-stats "${workload[@]}" --mix set=1 --popularity sequential \
        -c 8 -d 8 -n 100000 "127.0.0.1:${port[$1]}" >/dev/null
}
start memcached "$memcached"
start kvcached "$kvcached"
trap 'kill ${pid[memcached]} ${pid[kvcached]} 2>/dev/null || true; rm -rf "$dir"' EXIT

taskset -c $load_core "$kvblast" run -q --no-server-stats "${workload[@]}" -c "$conns" \
    -D "${duration}s" --json "$dir/cap.json" "127.0.0.1:${port[memcached]}" >/dev/null
capacity=$(python3 -c "import json; print(int(json.load(open('$dir/cap.json'))['ops']['all']['rate']))")
rate=$(python3 -c "print(int($capacity * $fraction))")
pace=(--rate "$rate")
echo "memcached: $("$memcached" -V); kvcached: $("$kvcached" -V); $(nproc) cores"
if [ "$rate" -eq 0 ]; then
    pace=()
    echo "memcached closed-loop capacity: $capacity req/s; closed loop, $conns connections, ${duration}s per run"
else
    echo "memcached closed-loop capacity: $capacity req/s; open loop at $fraction of it: $rate req/s, $conns connections, ${duration}s per run"
fi
printf '%-10s %6s %10s %10s %10s %10s %8s\n' server round req/s p50_us p99_us p999_us behind
for round in $(seq 1 "$rounds"); do
    order=(memcached kvcached)
    [ $((round % 2)) -eq 0 ] && order=(kvcached memcached)
    for s in "${order[@]}"; do
        taskset -c $load_core "$kvblast" run -q --no-server-stats "${workload[@]}" -c "$conns" \
            "${pace[@]}" -D "${duration}s" --json "$dir/$s-$round.json" \
            "127.0.0.1:${port[$s]}" >/dev/null
        python3 - "$dir/$s-$round.json" "$s" "$round" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
a = d["ops"]["all"]
print(f"{sys.argv[2]:<10} {sys.argv[3]:>6} {a['rate']:>10} {a['p50_us']:>10.1f} {a['p99_us']:>10.1f} "
      f"{a['p999_us']:>10.1f} {str(d['fell_behind']):>8}")
EOF
    done
done
python3 - "$dir" "$rounds" <<'EOF'
import json, statistics, sys
d, rounds = sys.argv[1], int(sys.argv[2])
med = {}
for s in ("memcached", "kvcached"):
    runs = [json.load(open(f"{d}/{s}-{r}.json"))["ops"]["all"] for r in range(1, rounds + 1)]
    med[s] = {k: statistics.median(x[k] for x in runs) for k in ("p50_us", "p99_us", "p999_us")}
print("median      " + "  ".join(f"{k}: memcached {med['memcached'][k]:.1f} kvcached {med['kvcached'][k]:.1f}"
                                  f" ({med['kvcached'][k] / med['memcached'][k]:.2f})" for k in ("p50_us", "p99_us", "p999_us")))
EOF
