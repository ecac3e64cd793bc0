#!/usr/bin/env bash
# Warm restart, kvcached and Debian's memcached side by side (both support -e and SIGUSR1):
# load N items, stop with SIGUSR1 (timed until the process exits), start again with the same
# -e (timed until the port accepts and `stats` answers), and count the items that came back.
#
# memcached's -e maps item memory from the file (it must be on tmpfs: /dev/shm); kvcached
# writes a snapshot at shutdown and reads it back at start (any file system).
#
# usage: bench/warm_restart.sh [-n ITEMS] [-v VALUE_BYTES] [-m MB]
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh

items=1000000
value=100
mem=1024
while getopts "n:v:m:" opt; do
    case $opt in
        n) items=$OPTARG ;;
        v) value=$OPTARG ;;
        m) mem=$OPTARG ;;
        *) echo "usage: $0 [-n ITEMS] [-v VALUE_BYTES] [-m MB]" >&2; exit 2 ;;
    esac
done

cargo build --release -q -p kvcached -p kvblast
bin=${CARGO_TARGET_DIR:-target}/release
memcached=${MEMCACHED:-/usr/bin/memcached}
mc_version=$("$memcached" -V | awk '{print $2}')
user=(); [ "$(id -u)" = 0 ] && user=(-u root)
ms() { date +%s%3N; }

echo "machine: $(nproc) cores; $items items of $value bytes, -m $mem; memcached $mc_version"
for name in kvcached memcached; do
    if [ "$name" = kvcached ]; then prog=$bin/kvcached; else prog=$memcached; fi
    file=/dev/shm/kvcache-warm-$$-$name
    rm -f "$file" "$file.meta"
    port=$(free_port)
    args=("${user[@]}" -l 127.0.0.1 -p "$port" -t 1 -m "$mem" -e "$file")
    "$prog" "${args[@]}" >/dev/null 2>&1 &
    pid=$!
    wait_port "$port"
    taskset -c 1 "$bin/kvblast" run -q --workload fixedsize --key-size 20 --value-size "$value" \
        --keys "$items" --popularity sequential --load -n 1 "127.0.0.1:$port" >/dev/null
    before=$(stat "$port" curr_items)
    t0=$(ms); kill -USR1 "$pid"; wait "$pid" || true; stopped=$(( $(ms) - t0 ))
    size=$(du -k "$file" | awk '{print $1}')
    # memcached refuses a restart in the same second as the stop (its clock check).
    sleep 1.1
    t1=$(ms)
    "$prog" "${args[@]}" >/dev/null 2>&1 &
    pid=$!
    wait_port "$port"
    after=$(stat "$port" curr_items); t2=$(ms)
    echo "$name: $before items; stop (SIGUSR1 to exit) $stopped ms; file $((size / 1024)) MiB; start until serving $((t2 - t1)) ms; $after items back"
    kill "$pid"; wait "$pid" 2>/dev/null || true
    rm -f "$file" "$file.meta"
done
