#!/usr/bin/env bash
# Resident memory per item, kvcached next to Debian's memcached, in one run.
#
# Both servers start with the same -m; kvblast loads ITEMS items with KEY-byte keys and
# VALUE-byte values into each (every key set once, nothing evicted); then the script reads
# each server's resident set (VmRSS) and curr_items, and reports bytes per item, total and
# above the empty server's RSS, and the kvcached/memcached ratio. Then, with the items in
# place and no client, it measures the CPU each server uses for IDLE seconds (-i, default
# 10; 0 skips it): what a full but quiet cache costs its machine (background threads), and
# how often its threads were switched to in that time (context switches per second).
#
# usage: bench/memory.sh [-n ITEMS] [-k KEY] [-v VALUE] [-m MEGABYTES] [-i IDLE] [-M "MEMCACHED ARGS"] [-- KVCACHED ARGS]
#   -M: arguments for memcached only (e.g. its own extstore file, beside kvcached's flash tier)
#   MEMCACHED=/path/to/memcached  the reference (default /usr/bin/memcached)
#   KVCACHED=/path/to/kvcached    another kvcached build (default target/release/kvcached)
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh

items=2000000
key=15
value=32
mem=1024
idle=10
mc_extra=()
while getopts "n:k:v:m:i:M:" opt; do
    case $opt in
        n) items=$OPTARG ;;
        k) key=$OPTARG ;;
        v) value=$OPTARG ;;
        m) mem=$OPTARG ;;
        i) idle=$OPTARG ;;
        M) read -r -a mc_extra <<<"$OPTARG" ;;
        *) echo "usage: $0 [-n ITEMS] [-k KEY] [-v VALUE] [-m MEGABYTES] [-i IDLE] [-M ARGS] [-- KVCACHED ARGS]" >&2; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
kv_extra=("$@")

cargo build --release -q -p kvcached -p kvblast
memcached=${MEMCACHED:-/usr/bin/memcached}
kvcached=${KVCACHED:-target/release/kvcached}
hz=$(getconf CLK_TCK)

rss_kib() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status"; }
# switches PID: context switches of all its threads so far (each one a wakeup or a preemption).
switches() { cat /proc/"$1"/task/*/status 2>/dev/null | awk '/ctxt_switches/ {s += $2} END {print s}'; }

echo "items: $items, key $key bytes, value $value bytes, -m $mem; $(nproc) cores"
printf '%-10s %12s %12s %12s %14s %14s %12s %14s\n' server curr_items rss_empty_MiB rss_full_MiB bytes/item "above empty" "idle_cpu_%" "idle_switch/s"
declare -A per_item
for server in memcached kvcached; do
    port=$(free_port)
    if [ $server = memcached ]; then
        "$memcached" "${user_args[@]}" -l 127.0.0.1 -p "$port" -t 1 -m "$mem" "${mc_extra[@]}" &
    else
        "$kvcached" "${user_args[@]}" -l 127.0.0.1 -p "$port" -t 1 -m "$mem" "${kv_extra[@]}" &
    fi
    pid=$!
    wait_port "$port"
    empty=$(rss_kib $pid)
    target/release/kvblast run -q --no-server-stats --keys "$items" --key-size "$key" \
        --value-size "$value" --popularity sequential --mix set=1 -c 8 -d 16 -n "$items" \
        "127.0.0.1:$port" >/dev/null
    n=$(stat "$port" curr_items)
    full=$(rss_kib $pid)
    cpu=-
    wakes=-
    if [ "$idle" != 0 ]; then
        t0=$(cpu_ticks $pid); w0=$(switches $pid); sleep "$idle"; t1=$(cpu_ticks $pid); w1=$(switches $pid)
        cpu=$(python3 -c "print(f'{($t1 - $t0) / $hz / $idle * 100:.1f}')")
        wakes=$(python3 -c "print(f'{($w1 - $w0) / $idle:.1f}')")
    fi
    kill $pid; wait $pid 2>/dev/null || true
    line=$(python3 -c "
n, e, f = $n, $empty, $full
print(f'{n} {e/1024:.1f} {f/1024:.1f} {f*1024/max(n,1):.2f} {(f-e)*1024/max(n,1):.2f}')")
    read -r n e f b a <<<"$line"
    per_item[$server]=$b
    printf '%-10s %12s %12s %12s %14s %14s %12s %14s\n' "$server" "$n" "$e" "$f" "$b" "$a" "$cpu" "$wakes"
done
python3 -c "print(f'kvcached/memcached bytes per item: {${per_item[kvcached]}/${per_item[memcached]}:.2f}')"
echo "memcached: $("$memcached" -V) ${mc_extra[*]}; kvcached: $("$kvcached" -V) ${kv_extra[*]}"
