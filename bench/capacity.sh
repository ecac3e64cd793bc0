#!/usr/bin/env bash
# Side-by-side capacity curves of kvcached and Debian's memcached, in one run.
#
# Both servers run with one worker thread, pinned to one core; kvblast is pinned to the other.
# For each latency objective (default: KV-Cache's Cap_avg and Cap_max at 1 ms, and IX's p99
# at 1 ms) kvblast bisects open-loop rates against memcached, then against kvcached
# (alternating, so that a noisy neighbour hurts both alike). It prints each capacity and the
# kvcached/memcached ratios, and draws every step of every search as one latency-against-
# throughput plot (p99 solid, mean dashed), one curve per server.
#
# usage: bench/capacity.sh [-D SECONDS] [-s STEPS] [-c CONNS] [-S "avg=1ms max=1ms p99=1ms"]
#                          [-o DIR] [-N] [-- KVBLAST ARGS]
#   -D: length of each open-loop step (default 2); -s: bisection steps per search (default 6);
#   -c: connections (default 50); -o: where the JSON reports and plots go (default: a new
#   temporary directory); -N: run the servers and kvblast at nice -10 (root), which shields
#   them from other work on a shared machine; KVBLAST ARGS replace the default workload
#   (--workload usr --keys 100000 --load).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh

step_secs=2
steps=6
conns=50
slos="avg=1ms max=1ms p99=1ms"
out=
nice_cmd=()
while getopts "D:s:c:S:o:N" opt; do
    case $opt in
        D) step_secs=$OPTARG ;;
        s) steps=$OPTARG ;;
        c) conns=$OPTARG ;;
        S) slos=$OPTARG ;;
        o) out=$OPTARG ;;
        N) nice_cmd=(nice -n -10) ;;
        *) echo "usage: $0 [-D SECONDS] [-s STEPS] [-c CONNS] [-S SLOS] [-o DIR] [-- KVBLAST ARGS]" >&2; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
load_args=("$@")
[ ${#load_args[@]} -gt 0 ] || load_args=(--workload usr --keys 100000 --load)
[ -n "$out" ] || out=$(mktemp -d /tmp/kvcache-capacity.XXXXXX)
mkdir -p "$out"

server_core=1
load_core=0
[ "$(nproc)" -ge 2 ] || { server_core=0; echo "warning: one core: servers and load share it" >&2; }

cargo build --release -q -p kvcached -p kvblast
bin=${CARGO_TARGET_DIR:-target}/release
kvcached=$bin/kvcached
kvblast=$bin/kvblast
memcached=${MEMCACHED:-/usr/bin/memcached}
mc_version=$("$memcached" -V | awk '{print $2}')

pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done' EXIT

declare -A port
for server in memcached kvcached; do
    port[$server]=$(free_port)
    exe=$memcached
    [ $server = kvcached ] && exe=$kvcached
    "${nice_cmd[@]}" taskset -c $server_core "$exe" "${user_args[@]}" -l 127.0.0.1 -p "${port[$server]}" -t 1 \
        -m 1024 -c 4096 &
    pids+=($!)
    wait_port "${port[$server]}"
done

echo "capacity: ${step_secs}s per step, $steps steps, $conns connections, load: ${load_args[*]}"
echo "$(nproc) cores; servers on core $server_core (one worker thread each), kvblast on core $load_core"
echo "memcached: $memcached $mc_version; kvcached: $($kvcached -V)"
[ ${#nice_cmd[@]} -eq 0 ] || echo "servers and kvblast at nice -10"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
plot_args=()
for slo in $slos; do
    name=${slo%%=*}
    for server in memcached kvcached; do
        json=$out/$server-$name.json
        echo "== $server, SLO $slo" >&2
        timeout 600 "${nice_cmd[@]}" taskset -c $load_core "$kvblast" capacity -q -c "$conns" -D "${step_secs}s" \
            --steps "$steps" --slo "$slo" "${load_args[@]}" --json "$json" \
            "127.0.0.1:${port[$server]}" | grep -E '^ *[0-9]+ |^capacity' >&2
        plot_args+=("$server=$json")
    done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"

"$kvblast" plot -o "$out/capacity.png" "${plot_args[@]}"
"$kvblast" plot -o "$out/capacity.svg" "${plot_args[@]}"

python3 - "$out" $slos <<'EOF'
import json, sys
out, slos = sys.argv[1], sys.argv[2:]
print(f"{'objective':<12}{'memcached req/s':>18}{'kvcached req/s':>18}{'kvcached/memcached':>20}")
for slo in slos:
    name = slo.split("=")[0]
    caps = {s: json.load(open(f"{out}/{s}-{name}.json"))["capacity"] for s in ("memcached", "kvcached")}
    m, k = caps["memcached"], caps["kvcached"]
    ratio = f"{k / m:.2f}" if m > 0 else "n/a"
    print(f"{slo:<12}{m:>18.0f}{k:>18.0f}{ratio:>20}")
EOF
echo "plot: $out/capacity.png (and .svg); reports: $out/*.json"
