#!/usr/bin/env bash
# System calls per request: memcached ($MEMCACHED) and kvcached under each I/O runtime
# (-o io=epoll, -o io=uring), the same closed-loop GET load, one run each.
#
# Each server runs with one worker thread on core 1; kvblast (core 0) sets KEYS keys, then
# sends REQUESTS gets of 32-byte values (uniform popularity) over CONNS connections with
# DEPTH requests in flight on each. `perf stat -e raw_syscalls:sys_enter` counts every system
# call the server process makes during the gets (a tracepoint: the count costs little, unlike
# strace, which slows every call and so changes how much a turn of the loop batches); the
# server's own cmd_get says how many requests it answered. It also reports the server's CPU
# time per request over the same window.
#
# usage: bench/syscalls.sh [-n REQUESTS] [-c CONNS] [-d DEPTH] [-k KEYS]
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh

requests=1000000
conns=50
depth=1
keys=100000
while getopts "n:c:d:k:" opt; do
    case $opt in
        n) requests=$OPTARG ;;
        c) conns=$OPTARG ;;
        d) depth=$OPTARG ;;
        k) keys=$OPTARG ;;
        *) echo "usage: $0 [-n REQUESTS] [-c CONNS] [-d DEPTH] [-k KEYS]" >&2; exit 2 ;;
    esac
done
command -v perf >/dev/null || { echo "perf not found (Debian: linux-perf)" >&2; exit 1; }

bench_binaries

echo "$requests gets, $conns connections, depth $depth, 32-byte values, $keys keys; $(nproc) cores"
echo "memcached: $("$memcached" -V); kvcached: $("$kvcached" -V)"
printf '%-16s %12s %12s %14s %14s\n' server gets syscalls syscalls/req cpu_us/req
for server in memcached kvcached-epoll kvcached-uring; do
    port=$(free_port)
    case $server in
        memcached) taskset -c $server_core "$memcached" "${user_args[@]}" -l 127.0.0.1 -p "$port" -t 1 -m 256 & ;;
        kvcached-epoll) taskset -c $server_core "$kvcached" "${user_args[@]}" -l 127.0.0.1 -p "$port" -t 1 -m 256 -o io=epoll & ;;
        kvcached-uring) taskset -c $server_core "$kvcached" "${user_args[@]}" -l 127.0.0.1 -p "$port" -t 1 -m 256 -o io=uring & ;;
    esac
    pid=$!
    wait_port "$port"
    "$kvblast" run -q --no-server-stats --keys "$keys" --value-size 32 --mix set=1 \
        --popularity sequential -c 8 -d 8 -n "$keys" "127.0.0.1:$port" >/dev/null
    g0=$(stat "$port" cmd_get)
    t0=$(cpu_ticks $pid)
    perf_out=$(mktemp)
    perf stat -x, -e raw_syscalls:sys_enter -p "$pid" -o "$perf_out" &
    perf_pid=$!
    sleep 0.5 # perf attached
    taskset -c $load_core "$kvblast" run -q --no-server-stats --keys "$keys" --value-size 32 \
        --mix get=1 --popularity uniform -c "$conns" -d "$depth" -n "$requests" \
        "127.0.0.1:$port" >/dev/null
    kill -INT $perf_pid
    wait $perf_pid 2>/dev/null || true
    t1=$(cpu_ticks $pid)
    g1=$(stat "$port" cmd_get)
    calls=$(awk -F, '/raw_syscalls:sys_enter/ {print $1}' "$perf_out")
    rm -f "$perf_out"
    kill $pid
    wait $pid 2>/dev/null || true
    python3 -c "
gets, calls, ticks, hz = $g1 - $g0, $calls, $t1 - $t0, $(getconf CLK_TCK)
print(f'{\"$server\":<16} {gets:>12} {calls:>12} {calls / max(gets, 1):>14.3f} {ticks / hz / max(gets, 1) * 1e6:>14.3f}')"
done
echo "(syscalls: every system call the server made while the gets ran, the few made by the stats requests and the idle waits before and after included)"
