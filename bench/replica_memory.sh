#!/usr/bin/env bash
# A replica's memory when many items expire at once.
#
# Starts a master and a replica that follows it (`--replica-of`), loads ITEMS items that all
# expire EXPTIME seconds after they are set into the master, waits until the replica holds
# them all, then until its expiry sweep has removed them. Reports the replica's resident
# memory (VmRSS) and peak (VmHWM) when full and after the expiry: the peak's growth is what
# removing the items cost beyond holding them (a replica remembers what it removes on its
# own while an older copy of the item may still arrive).
#
# There is no reference side: memcached has no replication. Compare two kvcached builds by
# running this once with each (KVCACHED=...).
#
# usage: bench/replica_memory.sh [-n ITEMS] [-e EXPTIME] [-m MEGABYTES]
#   KVCACHED=/path/to/kvcached    another kvcached build (default target/release/kvcached)
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh

items=1000000
exptime=20
mem=512
while getopts "n:e:m:" opt; do
    case $opt in
        n) items=$OPTARG ;;
        e) exptime=$OPTARG ;;
        m) mem=$OPTARG ;;
        *) echo "usage: $0 [-n ITEMS] [-e EXPTIME] [-m MEGABYTES]" >&2; exit 2 ;;
    esac
done

bench_binaries
status_kib() { awk -v f="$2:" '$1 == f {print $2}' "/proc/$1/status"; }
# wait_for PORT WANT SECONDS: poll the replica's curr_items until it equals WANT.
wait_for() {
    local n
    for _ in $(seq 1 $(($3 * 5))); do
        n=$(stat "$1" curr_items)
        [ "$n" = "$2" ] && return 0
        sleep 0.2
    done
    echo "replica holds $n items, not $2, after $3 s" >&2
    return 1
}

mport=$(free_port)
rport=$(free_port)
"$kvcached" "${user_args[@]}" -l 127.0.0.1 -p "$mport" -t 1 -m "$mem" &
mpid=$!
"$kvcached" "${user_args[@]}" -l 127.0.0.1 -p "$rport" -t 1 -m "$mem" --replica-of "127.0.0.1:$mport" &
rpid=$!
trap 'kill $mpid $rpid 2>/dev/null || true; wait 2>/dev/null || true' EXIT
wait_port "$mport"
wait_port "$rport"

echo "$($kvcached --version 2>/dev/null | head -1): $items items of 15-byte keys and 32-byte values expiring after $exptime s, -m $mem, -t 1; $(nproc) cores"
start=$(date +%s)
taskset -c "$load_core" "$kvblast" run -q --no-server-stats --keys "$items" --key-size 15 \
    --value-size 32 --popularity sequential --mix set=1 -c 8 -d 16 -n "$items" \
    --exptime "$exptime" "127.0.0.1:$mport" >/dev/null
wait_for "$rport" "$items" 60
loaded=$(($(date +%s) - start))
if [ "$loaded" -ge "$exptime" ]; then
    echo "loading and replicating took $loaded s, not under the expiry time ($exptime s): raise -e" >&2
    exit 1
fi
full_rss=$(status_kib $rpid VmRSS)
full_hwm=$(status_kib $rpid VmHWM)
wait_for "$rport" 0 $((exptime + 60))
after_rss=$(status_kib $rpid VmRSS)
after_hwm=$(status_kib $rpid VmHWM)
printf '%-28s %10s %10s\n' "replica" "RSS MiB" "peak MiB"
printf '%-28s %10.1f %10.1f\n' "holding the items" "$(echo "$full_rss / 1024" | bc -l)" "$(echo "$full_hwm / 1024" | bc -l)"
printf '%-28s %10.1f %10.1f\n' "after they expired" "$(echo "$after_rss / 1024" | bc -l)" "$(echo "$after_hwm / 1024" | bc -l)"
printf 'peak growth while the items expired: %.1f MiB (%.1f bytes per item)\n' \
    "$(echo "($after_hwm - $full_hwm) / 1024" | bc -l)" "$(echo "($after_hwm - $full_hwm) * 1024 / $items" | bc -l)"
