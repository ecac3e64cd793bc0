#!/usr/bin/env bash
# Connection churn: what a short-lived connection costs the server. Each connection is
# opened, asks one `get`, reads the reply and closes, as clients that connect per request
# (PHP, cron jobs, health checks) do.
#
# Three servers, alternating for ROUNDS rounds, each with one worker thread pinned to one
# core and the client on the other: memcached ($MEMCACHED), kvcached as it runs by default
# (io_uring, listeners accepting through the ring: multishot accepts), and the same kvcached
# with KVCACHED_ACCEPT_MULTISHOT=0 (accept4 on readiness from the poller, as under epoll).
# For each: connections per second and the server's CPU time per connection (/proc), then
# medians and the ratios to memcached.
#
# usage: bench/accept.sh [-d SECONDS] [-r ROUNDS] [-p CONNS]
#   -p  connections the client keeps cycling at once (default 4)
#   MEMCACHED=/path/to/memcached  the reference (default /usr/bin/memcached)
#   KVCACHED=/path/to/kvcached    another kvcached build (default target/release/kvcached)
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh

duration=5
rounds=5
procs=4
while getopts "d:r:p:" opt; do
    case $opt in
        d) duration=$OPTARG ;;
        r) rounds=$OPTARG ;;
        p) procs=$OPTARG ;;
        *) echo "usage: $0 [-d SECONDS] [-r ROUNDS] [-p CONNS]" >&2; exit 2 ;;
    esac
done

bench_binaries
mc_version=$("$memcached" -V | awk '{print $2}')
hz=$(getconf CLK_TCK)

# The client: kvblast with CONNS connections, each opening a connection, sending one get
# (of 1,000 keys never set: a miss) and closing it (`--reconnect-interval 1`), for SECONDS.
# Connections are counted by the server (`total_connections`; the stats connection taken
# after the run counts itself once).
results=$(mktemp)
trap 'rm -f "$results"; [ -n "${pid:-}" ] && kill "$pid" 2>/dev/null || true' EXIT

for round in $(seq 1 "$rounds"); do
    for server in memcached kvcached kvcached-accept4; do
        port=$(free_port)
        case $server in
            memcached)
                taskset -c $server_core "$memcached" "${user_args[@]}" -l 127.0.0.1 -p "$port" \
                    -U 0 -t 1 -m 64 & ;;
            kvcached)
                taskset -c $server_core "$kvcached" "${user_args[@]}" -l 127.0.0.1 -p "$port" \
                    -U 0 -t 1 -m 64 & ;;
            kvcached-accept4)
                KVCACHED_ACCEPT_MULTISHOT=0 taskset -c $server_core "$kvcached" "${user_args[@]}" \
                    -l 127.0.0.1 -p "$port" -U 0 -t 1 -m 64 & ;;
        esac
        pid=$!
        wait_port "$port"
        t0=$(cpu_ticks "$pid")
        c0=$(stat "$port" total_connections)
        start=$(date +%s.%N)
        timeout $((duration + 60)) taskset -c $load_core "$kvblast" run -q --no-server-stats \
            -c "$procs" --depth 1 --reconnect-interval 1 --mix get=1 --keys 1000 \
            --value-size 32 -D "${duration}s" "127.0.0.1:$port" >/dev/null
        end=$(date +%s.%N)
        t1=$(cpu_ticks "$pid")
        n=$(( $(stat "$port" total_connections) - c0 - 1 ))
        kill "$pid"; wait "$pid" 2>/dev/null || true; pid=
        python3 -c "
n = $n; secs = $end - $start
print('$server $round', f'{n / secs:.0f}', f'{($t1 - $t0) / $hz / max(n, 1) * 1e6:.2f}')" >>"$results"
    done
done

echo "connection churn: connect, get, close (kvblast --reconnect-interval 1); $procs connections at once, ${duration}s per run;"
echo "$rounds rounds alternating; $(nproc) cores; server on core $server_core (1 worker thread), client on core $load_core"
echo "memcached: $memcached $mc_version; kvcached: $($kvcached -V)"
printf '%-18s %5s %12s %14s\n' server round "conns/s" "cpu_us/conn"
while read -r s r cps us; do
    printf '%-18s %5s %12s %14s\n' "$s" "$r" "$cps" "$us"
done <"$results"
python3 - "$results" <<'EOF'
import sys, statistics
rows = [l.split() for l in open(sys.argv[1])]
servers = ["memcached", "kvcached", "kvcached-accept4"]
def med(server, i):
    return statistics.median(float(r[i]) for r in rows if r[0] == server)
print(f"{'median':18} {'conns/s':>12} {'cpu_us/conn':>14} {'cpu vs memcached':>18}")
mc = med("memcached", 3)
for s in servers:
    print(f"{s:18} {med(s, 2):12.0f} {med(s, 3):14.2f} {med(s, 3) / mc:18.2f}")
print(f"kvcached multishot accepts / accept4: cpu per connection "
      f"{med('kvcached', 3) / med('kvcached-accept4', 3):.2f}")
EOF
