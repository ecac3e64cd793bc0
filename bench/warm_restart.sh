#!/usr/bin/env bash
# Warm restart, kvcached and a reference memcached side by side (both support -e and
# SIGUSR1): load N items, stop with SIGUSR1 (timed until the process exits), start again
# with the same -e (timed until `stats` answers on the port, polled every millisecond) and
# count the items that came back. Rounds alternate which server goes first; the report
# gives every round, the medians and kvcached/memcached ratios of the medians.
#
# memcached's -e maps item memory from the file (it must be on tmpfs: /dev/shm); kvcached
# writes a snapshot at shutdown and reads it back at start (any file system).
#
# The reference is $MEMCACHED (default /usr/bin/memcached); its version is in the output.
# $KVCACHED runs another kvcached binary (an older build, say) instead of this tree's.
# Both servers get one worker thread (-t 1); nothing is pinned: the restore uses every core
# it may, as a restart on a real machine would.
#
# With -f DIR both servers get a flash file of SIZE (-F, default 2g) in DIR
# (`-o ext_path=DIR/NAME:SIZE`, UDP off): kvcached keeps its flash items across the
# restart; memcached 1.6.45 starts empty ("memory restart with extstore not presently
# supported"), so its items back are 0 and the start ratio compares unlike work.
#
# usage: bench/warm_restart.sh [-n ITEMS] [-v VALUE_BYTES] [-m MB] [-r ROUNDS] [-f DIR [-F SIZE]]
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh

items=1000000
value=100
mem=1024
rounds=3
flash_dir=
flash_size=2g
while getopts "n:v:m:r:f:F:" opt; do
    case $opt in
        n) items=$OPTARG ;;
        v) value=$OPTARG ;;
        m) mem=$OPTARG ;;
        r) rounds=$OPTARG ;;
        f) flash_dir=$OPTARG ;;
        F) flash_size=$OPTARG ;;
        *) echo "usage: $0 [-n ITEMS] [-v VALUE_BYTES] [-m MB] [-r ROUNDS] [-f DIR [-F SIZE]]" >&2; exit 2 ;;
    esac
done
if [ -n "$flash_dir" ]; then
    mkdir -p "$flash_dir"
fi

cargo build --release -q -p kvcached -p kvblast
bin=${CARGO_TARGET_DIR:-target}/release
memcached=${MEMCACHED:-/usr/bin/memcached}
mc_version=$("$memcached" -V | awk '{print $2}')
kvcached=${KVCACHED:-$bin/kvcached}
kv_version=$("$kvcached" -V | awk '{print $2}')
ns() { date +%s%N; }

# start_serving PORT PROG ARGS...: start the server (in the background, from the same
# process that polls, so that no interpreter's start-up is counted) and wait (10 s at most)
# until `stats` answers on PORT, polling every millisecond; print the milliseconds from
# the fork to that answer, curr_items and the server's pid.
start_serving() {
    python3 - "$@" <<'PY'
import socket, subprocess, sys, time
port = int(sys.argv[1])
t0 = time.monotonic_ns()
proc = subprocess.Popen(sys.argv[2:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
deadline = time.monotonic() + 10
while time.monotonic() < deadline:
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
    except OSError:
        time.sleep(0.001)
        continue
    s.sendall(b"stats\r\n")
    buf = b""
    while not buf.endswith(b"END\r\n"):
        d = s.recv(65536)
        if not d:
            break
        buf += d
    ms = (time.monotonic_ns() - t0) // 1000000
    items = [l.split()[2] for l in buf.decode().splitlines() if l.startswith("STAT curr_items ")]
    if items:
        print(ms, items[0], proc.pid)
        sys.exit(0)
    time.sleep(0.001)
proc.kill()
sys.exit("server did not start serving")
PY
}

results=$(mktemp)
trap 'rm -f "$results" /dev/shm/kvcache-warm-$$-*' EXIT

# one NAME ROUND: load, stop, start once; append a row to $results.
one() {
    local name=$1 round=$2 prog file port pid before t0 stopped size started after
    if [ "$name" = kvcached ]; then prog=$kvcached; else prog=$memcached; fi
    file=/dev/shm/kvcache-warm-$$-$name
    rm -f "$file" "$file.meta"
    port=$(free_port)
    local args=("${user_args[@]}" -l 127.0.0.1 -p "$port" -t 1 -m "$mem" -e "$file")
    if [ -n "$flash_dir" ]; then
        rm -f "$flash_dir/warm-$name"
        args+=(-U 0 -o "ext_path=$flash_dir/warm-$name:$flash_size")
    fi
    "$prog" "${args[@]}" >/dev/null 2>&1 &
    pid=$!
    wait_port "$port"
    "$bin/kvblast" run -q --workload fixedsize --key-size 20 --value-size "$value" \
        --keys "$items" --popularity sequential --load -n 1 "127.0.0.1:$port" >/dev/null
    before=$(stat "$port" curr_items)
    t0=$(ns); kill -USR1 "$pid"; wait "$pid" || true; stopped=$(( ($(ns) - t0) / 1000000 ))
    size=$(du -k "$file" | awk '{print $1}')
    # memcached refuses a restart in the same second as the stop (its clock check).
    sleep 1.1
    read -r started after pid < <(start_serving "$port" "$prog" "${args[@]}")
    echo "$name round $round: $before items; stop (SIGUSR1 to exit) $stopped ms; file $((size / 1024)) MiB; start until serving $started ms; $after items back"
    echo "$name $stopped $started $before $after" >>"$results"
    kill "$pid"
    while kill -0 "$pid" 2>/dev/null; do sleep 0.01; done
    rm -f "$file" "$file.meta"
    if [ -n "$flash_dir" ]; then rm -f "$flash_dir/warm-$name"; fi
}

echo "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg); $items items of $value bytes, -m $mem -t 1; $rounds rounds${flash_dir:+; flash file of $flash_size in $flash_dir}"
echo "servers: kvcached $kv_version, memcached $mc_version ($memcached)"
for r in $(seq 1 "$rounds"); do
    if [ $((r % 2)) = 1 ]; then order="kvcached memcached"; else order="memcached kvcached"; fi
    for name in $order; do one "$name" "$r"; done
done

python3 - "$results" "$mc_version" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
mc = sys.argv[2]
def med(server, col):
    return statistics.median(int(r[col]) for r in rows if r[0] == server)
for col, what in ((1, "stop"), (2, "start until serving")):
    k, m = med("kvcached", col), med("memcached", col)
    print(f"median {what}: kvcached {k:.0f} ms, memcached {mc} {m:.0f} ms, kvcached/memcached {k / m:.2f}")
lost = [r for r in rows if r[3] != r[4]]
print("items: every round got back all it held" if not lost else f"items lost in {len(lost)} rounds")
PY
