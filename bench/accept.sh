#!/usr/bin/env bash
# Connection churn: what a short-lived connection costs the server. Each connection is
# opened, asks `version`, reads the reply and closes, as clients that connect per request
# (PHP, cron jobs, health checks) do.
#
# Three servers, alternating for ROUNDS rounds, each with one worker thread pinned to one
# core and the client on the other: memcached ($MEMCACHED), kvcached as it runs by default
# (io_uring, listeners accepting through the ring: multishot accepts), and the same kvcached
# with KVCACHED_ACCEPT_MULTISHOT=0 (accept4 on readiness from the poller, as under epoll).
# For each: connections per second and the server's CPU time per connection (/proc), then
# medians and the ratios to memcached.
#
# usage: bench/accept.sh [-d SECONDS] [-r ROUNDS] [-p PROCS]
#   -p  client processes (default 2): more keep the server busier, on the client's one core
#   MEMCACHED=/path/to/memcached  the reference (default /usr/bin/memcached)
#   KVCACHED=/path/to/kvcached    another kvcached build (default target/release/kvcached)
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh

duration=5
rounds=5
procs=2
while getopts "d:r:p:" opt; do
    case $opt in
        d) duration=$OPTARG ;;
        r) rounds=$OPTARG ;;
        p) procs=$OPTARG ;;
        *) echo "usage: $0 [-d SECONDS] [-r ROUNDS] [-p PROCS]" >&2; exit 2 ;;
    esac
done

bench_binaries
mc_version=$("$memcached" -V | awk '{print $2}')
hz=$(getconf CLK_TCK)

# The client: PROCS processes, each opening connections one after another for SECONDS
# (bounded by time and by a count); prints the connections completed.
client='
import socket, sys, time, os
port, secs, procs = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
def run():
    n = 0
    end = time.monotonic() + secs
    while time.monotonic() < end and n < 10_000_000:
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.sendall(b"version\r\n")
        buf = b""
        while not buf.endswith(b"\r\n"):
            d = s.recv(64)
            if not d:
                sys.exit("closed by the server")
            buf += d
        s.close()
        n += 1
    return n
pipes = []
for _ in range(procs):
    r, w = os.pipe()
    if os.fork() == 0:
        os.close(r)
        os.write(w, str(run()).encode())
        os._exit(0)
    os.close(w)
    pipes.append(r)
total = 0
for r in pipes:
    total += int(os.read(r, 64) or b"0")
    os.close(r)
for _ in pipes:
    os.wait()
print(total)
'

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
        start=$(date +%s.%N)
        n=$(timeout $((duration + 60)) taskset -c $load_core python3 -c "$client" "$port" \
            "$duration" "$procs")
        end=$(date +%s.%N)
        t1=$(cpu_ticks "$pid")
        kill "$pid"; wait "$pid" 2>/dev/null || true; pid=
        python3 -c "
n = $n; secs = $end - $start
print('$server $round', f'{n / secs:.0f}', f'{($t1 - $t0) / $hz / max(n, 1) * 1e6:.2f}')" >>"$results"
    done
done

echo "connection churn: connect, version, close; $procs client processes, ${duration}s per run;"
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
