#!/usr/bin/env bash
# Replication cost and lag, in one run (kvcached only: memcached has no replication).
#
# 1. Master throughput with no replica and with one replica attached: the master runs one
#    worker pinned to core 0; kvblast (closed loop, memaslap's 90/10 get/set mix, 50
#    connections) runs on core 1; the replica, when attached, also runs on core 1 (on a
#    2-core machine it competes with the load generator, which can only lower the second
#    figure). ROUNDS alternating pairs; reports the median requests/s of each and the ratio.
# 2. Replication lag (kvblast on core 0 with the master unless -L) under a write load at a given rate (open loop, all sets, VALUE-byte
#    values): every ~50 ms samples the master's `replica0_lag_bytes` and
#    `replica0_lag_seconds`, and measures the end-to-end lag: a probe key set on the master,
#    polled on the replica until it is there. Reports p50/p99/max of each.
#
# usage: bench/replication.sh [-d SECONDS] [-r ROUNDS] [-w RATE[,RATE...]] [-v VALUE_BYTES] [-s]
#   -s: skip part 1 (throughput)
#   -L CORE: where kvblast runs in part 2 (default 0, with the master, so that the replica
#      has core 1 to itself; a load generator that shares the replica's core starves it)
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh

duration=8
rounds=3
rates=20000
value=4096
skip=0
lag_load_core=0
while getopts "d:r:w:v:sL:" opt; do
    case $opt in
        d) duration=$OPTARG ;;
        r) rounds=$OPTARG ;;
        w) rates=$OPTARG ;;
        v) value=$OPTARG ;;
        s) skip=1 ;;
        L) lag_load_core=$OPTARG ;;
        *) echo "usage: $0 [-d SECONDS] [-r ROUNDS] [-w RATE,...] [-v VALUE_BYTES] [-s]" >&2; exit 2 ;;
    esac
done

cargo build --release -q -p kvcached -p kvblast
bin=${CARGO_TARGET_DIR:-target}/release
kvcached=$bin/kvcached
kvblast=$bin/kvblast
user=(); [ "$(id -u)" = 0 ] && user=(-u root)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

start() { # start CORE PORT ARGS... ; prints the pid
    local core=$1 port=$2; shift 2
    taskset -c "$core" "$kvcached" "${user[@]}" -l 127.0.0.1 -p "$port" -t 1 -m 1024 "$@" >/dev/null 2>&1 &
    local pid=$!
    pids+=("$pid")
    wait_port "$port"
    echo "$pid"
}
rps() { # rps JSON: requests/s of the run
    python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); o=r["ours"]; k=["cmd_get","cmd_set","delete_hits+misses","cmd_touch","incr_hits+misses"]; print(round(sum(o.get(x,0) for x in k)/r["seconds"]))' "$1"
}

echo "machine: $(nproc) cores; $(uname -r)"
tmp=$(mktemp -d)
if [ "$skip" = 0 ]; then
echo "== master throughput, no replica vs one replica (memaslap mix, 50 conns, ${duration}s, $rounds rounds)"
none=(); one=()
for r in $(seq "$rounds"); do
    for mode in none one; do
        mport=$(free_port)
        mpid=$(start 0 "$mport")
        rpid=""
        if [ "$mode" = one ]; then
            rport=$(free_port)
            rpid=$(start 1 "$rport" --replica-of "127.0.0.1:$mport")
        fi
        taskset -c 1 "$kvblast" run -q --workload memaslap --keys 100000 --load -c 50 \
            -D "${duration}s" --json "$tmp/$mode.json" "127.0.0.1:$mport" >/dev/null
        x=$(rps "$tmp/$mode.json")
        if [ "$mode" = none ]; then none+=("$x"); else one+=("$x"); fi
        echo "round $r $mode: $x req/s"
        kill "$mpid" ${rpid:+"$rpid"} 2>/dev/null || true
        wait "$mpid" ${rpid:+"$rpid"} 2>/dev/null || true
    done
done
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
mn=$(median "${none[@]}"); mo=$(median "${one[@]}")
echo "median no replica: $mn req/s; one replica: $mo req/s; ratio $(python3 -c "print(round($mo/$mn, 3))")"
fi
lag_run() {
local rate=$1
echo "== replication lag: sets of ${value}-byte values at $rate/s for ${duration}s"
mport=$(free_port); mpid=$(start 0 "$mport")
rport=$(free_port); rpid=$(start 1 "$rport" --replica-of "127.0.0.1:$mport")
taskset -c "$lag_load_core" "$kvblast" run -q --workload fixedsize --value-size "$value" --keys 100000 \
    --mix set=1 --rate "$rate" -c 8 -D "${duration}s" --json "$tmp/lag.json" \
    "127.0.0.1:$mport" >/dev/null &
load=$!
python3 - "$mport" "$rport" "$load" >"$tmp/lag.txt" <<'PY'
# Every ~50 ms: read the master's view of the replica's lag (stats replication), then set a
# probe key on the master and time how long until the replica returns it (end to end).
import os, socket, sys, time
mport, rport, load = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
def conn(port):
    s = socket.create_connection(("127.0.0.1", port)); s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s, s.makefile("rb")
(ms, mf), (rs, rf) = conn(mport), conn(rport)
def alive():
    try: os.kill(load, 0); return True
    except OSError: return False
deadline = time.time() + 600
i = 0
while alive() and time.time() < deadline:
    ms.sendall(b"stats replication\r\n"); st = {}
    for line in mf:
        if line == b"END\r\n": break
        p = line.split()
        if len(p) == 3: st[p[1].decode()] = p[2].decode()
    i += 1
    key = b"lagprobe:%d" % i
    ms.sendall(b"set " + key + b" 0 0 1\r\nx\r\n"); mf.readline()
    t0 = time.perf_counter(); seen = None
    while time.perf_counter() - t0 < 5:
        rs.sendall(b"get " + key + b"\r\n"); first = rf.readline()
        if first.startswith(b"VALUE"):
            rf.readline(); rf.readline(); seen = time.perf_counter() - t0; break
        time.sleep(0.0005)
    print(st.get("replica0_lag_bytes", "0"), st.get("replica0_lag_seconds", "0"),
          "%.6f" % (seen if seen is not None else 5.0), flush=True)
    time.sleep(0.05)
PY
wait "$load" || true
echo "achieved $(rps "$tmp/lag.json") sets/s"
python3 - "$tmp/lag.txt" <<'PY'
import sys
rows = [tuple(map(float, l.split())) for l in open(sys.argv[1]) if l.strip()]
def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(p * len(v)))] if v else 0
b = [r[0] for r in rows]; s = [r[1] for r in rows]; e = [r[2] for r in rows]
print(f"samples {len(rows)}; lag bytes p50 {pct(b,.5):.0f} p99 {pct(b,.99):.0f} max {max(b, default=0):.0f}; "
      f"lag seconds (stats) p50 {pct(s,.5):.3f} p99 {pct(s,.99):.3f} max {max(s, default=0):.3f}")
print(f"end-to-end (set on master until the replica returns it): "
      f"p50 {pct(e,.5)*1000:.1f} ms p99 {pct(e,.99)*1000:.1f} ms max {max(e, default=0)*1000:.1f} ms")
PY
kill "$mpid" "$rpid" 2>/dev/null || true
wait "$mpid" "$rpid" 2>/dev/null || true
}
for r in ${rates//,/ }; do lag_run "$r"; done
