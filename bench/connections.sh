#!/usr/bin/env bash
# Many connections, few of them busy: what 10,000 connections cost kvcached and memcached, in one
# run.
#
# For each server (alternating memcached, kvcached, memcached, ... for ROUNDS rounds), with one
# worker thread pinned to one core and the load generator on the other:
#   1. 100 busy connections alone: kvblast, closed loop, for SECONDS; requests/s from the
#      server's own cmd_get + cmd_set, and the server's CPU time per request (from /proc);
#   2. IDLE more connections that connect, ask `version` once (so the server has certainly
#      accepted and served them) and then stay open, silent: the server's resident memory
#      before and after gives the bytes one idle connection costs;
#   3. the same 100 busy connections again, now 1% of all: requests/s and CPU per request;
#   4. the idle connections close; curr_connections must return to its baseline.
# Then medians per server and the kvcached/memcached ratios.
#
# usage: bench/connections.sh [-d SECONDS] [-r ROUNDS] [-i IDLE]
#   MEMCACHED=/path/to/memcached  the reference (default /usr/bin/memcached; BENCHMARKS.md's
#                                 figures name the version they were measured against)
#   KVCACHED=/path/to/kvcached    another kvcached build (default target/release/kvcached)
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh

duration=5
rounds=3
idle=9900
while getopts "d:r:i:" opt; do
    case $opt in
        d) duration=$OPTARG ;;
        r) rounds=$OPTARG ;;
        i) idle=$OPTARG ;;
        *) echo "usage: $0 [-d SECONDS] [-r ROUNDS] [-i IDLE]" >&2; exit 2 ;;
    esac
done
busy=100

server_core=1
load_core=0
[ "$(nproc)" -ge 2 ] || { server_core=0; echo "warning: one core: server and load share it" >&2; }

# The idle connections are held by this script's helper: it needs the descriptors.
ulimit -n $((idle + 1024)) 2>/dev/null || {
    echo "cannot raise the open-file limit to $((idle + 1024)) (run as root or lower -i)" >&2
    exit 1
}

cargo build --release -q -p kvcached -p kvblast
target=${CARGO_TARGET_DIR:-target}
kvcached=${KVCACHED:-$target/release/kvcached}
kvblast=$target/release/kvblast
memcached=${MEMCACHED:-/usr/bin/memcached}
mc_version=$("$memcached" -V | awk '{print $2}')
hz=$(getconf CLK_TCK)
page_kib=$(($(getconf PAGESIZE) / 1024))

rss_kib() { awk -v p="$page_kib" '{print $2 * p}' "/proc/$1/statm"; }

# busy_run PORT PID: 100 busy connections for $duration s; prints "req/s cpu_us_per_req".
busy_run() {
    local port=$1 pid=$2 t0 t1 g0 g1 s0 s1 start end
    t0=$(cpu_ticks "$pid")
    g0=$(stat "$port" cmd_get); s0=$(stat "$port" cmd_set)
    start=$(date +%s.%N)
    timeout $((duration + 30)) taskset -c $load_core "$kvblast" run -q --no-server-stats \
        -c $busy -D "${duration}s" --workload etc --keys 10000 --look-aside \
        "127.0.0.1:$port" >/dev/null
    end=$(date +%s.%N)
    g1=$(stat "$port" cmd_get); s1=$(stat "$port" cmd_set)
    t1=$(cpu_ticks "$pid")
    python3 -c "
reqs = ($g1 - $g0) + ($s1 - $s0)
secs = $end - $start
print(f'{reqs / secs:.0f} {($t1 - $t0) / $hz / max(reqs, 1) * 1e6:.3f}')"
}

# The idle connections' holder: opens N, asks each `version`, says "ready N", then holds them
# until its stdin closes (bounded: it gives up after 120 s).
holder='
import socket, sys, select, time
port, n = int(sys.argv[1]), int(sys.argv[2])
socks = []
for _ in range(n):
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    socks.append(s)
for s in socks:
    s.sendall(b"version\r\n")
for s in socks:
    buf = b""
    while not buf.endswith(b"\r\n"):
        d = s.recv(64)
        if not d:
            sys.exit("closed by the server")
        buf += d
print("ready", len(socks), flush=True)
select.select([sys.stdin], [], [], 120)
for s in socks:
    s.close()
'

results=$(mktemp)
trap 'rm -f "$results"; [ -n "${pid:-}" ] && kill "$pid" 2>/dev/null || true' EXIT

for round in $(seq 1 "$rounds"); do
    for server in memcached kvcached; do
        port=$(free_port)
        bin=$memcached
        [ $server = kvcached ] && bin=$kvcached
        taskset -c $server_core "$bin" "${user_args[@]}" -l 127.0.0.1 -p "$port" -t 1 -m 256 \
            -c $((idle + busy + 100)) &
        pid=$!
        wait_port "$port"
        base=$(stat "$port" curr_connections)
        read -r rps1 us1 < <(busy_run "$port" "$pid")
        rss0=$(rss_kib "$pid")
        coproc HOLD { taskset -c $load_core python3 -c "$holder" "$port" "$idle"; }
        read -r ready held <&"${HOLD[0]}"
        [ "$ready" = ready ] || { echo "the idle connections failed" >&2; exit 1; }
        conns=$(stat "$port" curr_connections)
        rss1=$(rss_kib "$pid")
        read -r rps2 us2 < <(busy_run "$port" "$pid")
        rss2=$(rss_kib "$pid")
        exec {HOLD[1]}>&-
        wait "$HOLD_PID" 2>/dev/null || true
        # Every idle connection is gone again (poll, 10 s at most).
        after=$conns
        for _ in $(seq 1 200); do
            after=$(stat "$port" curr_connections)
            [ "$after" = "$base" ] && break
            sleep 0.05
        done
        kill "$pid"; wait "$pid" 2>/dev/null || true; pid=
        echo "$server $round $rps1 $us1 $rps2 $us2 $held $conns $rss0 $rss1 $rss2 $base $after" >>"$results"
    done
done

echo "$busy busy connections (kvblast, etc workload, closed loop, ${duration}s), then again with $idle idle ones;"
echo "$rounds rounds alternating; $(nproc) cores; server on core $server_core (1 worker thread), load on core $load_core"
echo "memcached: $memcached $mc_version; kvcached: $($kvcached -V)"
printf '%-10s %5s %10s %10s %10s %10s %8s %12s %12s %12s\n' server round "req/s" "us/req" \
    "req/s+idle" "us/req+idle" conns "rss0_KiB" "rss_idle_KiB" "B/idle_conn"
while read -r s r rps1 us1 rps2 us2 held conns rss0 rss1 rss2 base after; do
    per=$(( (rss1 - rss0) * 1024 / held ))
    printf '%-10s %5s %10s %10s %10s %10s %8s %12s %12s %12s\n' "$s" "$r" "$rps1" "$us1" "$rps2" \
        "$us2" "$conns" "$rss0" "$rss1" "$per"
    [ "$after" = "$base" ] || echo "  $s round $r: curr_connections $after after the idle ones closed, baseline $base" >&2
done <"$results"
python3 - "$results" <<'EOF'
import sys, statistics
rows = [l.split() for l in open(sys.argv[1])]
def med(server, f):
    return statistics.median(f(r) for r in rows if r[0] == server)
cols = {
    "req/s, 100 busy": lambda r: float(r[2]),
    "cpu us/req, 100 busy": lambda r: float(r[3]),
    "req/s, 100 busy + idle": lambda r: float(r[4]),
    "cpu us/req, 100 busy + idle": lambda r: float(r[5]),
    "bytes per idle connection": lambda r: (float(r[9]) - float(r[8])) * 1024 / float(r[6]),
}
print(f"{'median':32} {'memcached':>12} {'kvcached':>12} {'kv/mc':>8}")
for name, f in cols.items():
    m, k = med("memcached", f), med("kvcached", f)
    print(f"{name:32} {m:12.2f} {k:12.2f} {k / m if m else float('nan'):8.2f}")
for s in ("memcached", "kvcached"):
    print(f"{s}: req/s with the idle connections / without: "
          f"{med(s, lambda r: float(r[4]) / float(r[2])):.2f}")
EOF
