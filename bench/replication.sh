#!/usr/bin/env bash
# Replication cost and lag, in one run (kvcached only: memcached has no replication).
#
# 1. Master throughput with no replica and with N replicas attached (-n, default 2, each
#    pulling from the master): the master runs one worker pinned to core 0; kvblast (closed
#    loop, memaslap's 90/10 get/set mix, 50 connections) runs on core 1; the replicas, when
#    attached, also run on core 1 (on a 2-core machine they compete with the load generator,
#    which can only lower the second figure; they run niced unless -E). ROUNDS alternating pairs; reports the median
#    requests/s of each and the ratio. Because the load generator and the replicas share a
#    core here, it also reports the master's own cost: its CPU time per request (from
#    /proc, over its cmd_get + cmd_set), whose ratio is what the replicas cost the master's
#    capacity when it is the bottleneck (replicas and clients on machines of their own).
# 2. Replication lag under a write load (open loop, all sets, VALUE-byte values) with the N
#    replicas attached, at each rate of -w, or by default at half of the master's set
#    capacity (a closed-loop set-only run of the same values with no replica, measured
#    first, with kvblast where the lag run puts it and after the same fill: the master's
#    capacity where and as it runs).
#    kvblast runs on core 0 with the master unless -L. Every ~50 ms it samples the
#    master's `replicaI_lag_bytes` and `replicaI_lag_seconds` for every replica, and measures
#    the end-to-end lag: a probe key set on the master, polled on each replica until it is
#    there. Reports p50/p99/max of each, per replica. Before it, the master and replicas
#    are filled to steady state (closed-loop sets of the same values until -m's worth has
#    been written twice over, then the replicas caught up), as a cache in service is: an
#    empty server's first writes also pay for the kernel's first touch of its memory,
#    which on a VM whose memory the host reclaimed costs several times more than the
#    writes themselves (-C measures from empty, as before).
#
# usage: bench/replication.sh [-d SECONDS] [-r ROUNDS] [-n REPLICAS] [-w RATE[,RATE...]]
#                             [-v VALUE_BYTES] [-s] [-L CORE] [-C] [-E]
#   -s: skip part 1 (throughput)
#   -w none: skip part 2 (lag)
#   KVCACHED=/path/to/kvcached: another kvcached build (default: this tree's release build)
#   -C: measure the lag from empty servers (no fill first)
#   -E: run the replicas at the load generator's priority. By default they run under
#      `nice -n 19`: in part 1 they share core 1 with kvblast, and at equal priority the
#      CPU they take starves the load generator, which lowers the master's throughput
#      without the master being busier (replicas in service run on machines of their
#      own). In part 2 they have core 1 to themselves, so it changes nothing there.
#   -L CORE: where kvblast runs in part 2 (default 0, with the master, so that the replicas
#      have core 1 to themselves; a load generator that shares the replicas' core starves
#      them)
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh

duration=8
rounds=3
replicas=2
rates=half
value=4096
skip=0
lag_load_core=0
fill=1
replica_nice="nice -n 19"
while getopts "d:r:n:w:v:sL:CE" opt; do
    case $opt in
        d) duration=$OPTARG ;;
        r) rounds=$OPTARG ;;
        n) replicas=$OPTARG ;;
        w) rates=$OPTARG ;;
        v) value=$OPTARG ;;
        s) skip=1 ;;
        L) lag_load_core=$OPTARG ;;
        C) fill=0 ;;
        E) replica_nice="" ;;
        *) echo "usage: $0 [-d SECONDS] [-r ROUNDS] [-n REPLICAS] [-w RATE,...] [-v VALUE_BYTES] [-s] [-L CORE] [-C] [-E]" >&2; exit 2 ;;
    esac
done

cargo build --release -q -p kvcached -p kvblast
bin=${CARGO_TARGET_DIR:-target}/release
kvcached=${KVCACHED:-$bin/kvcached}
kvblast=$bin/kvblast
user=(); [ "$(id -u)" = 0 ] && user=(-u root)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

start() { # start CORE PORT ARGS... ; prints the pid
    local core=$1 port=$2; shift 2
    ${nice_cmd:-} taskset -c "$core" "$kvcached" "${user[@]}" -l 127.0.0.1 -p "$port" -t 1 -m 1024 "$@" >/dev/null 2>&1 &
    local pid=$!
    pids+=("$pid")
    started=$pid
    wait_port "$port"
    echo "$pid"
}
served() { # served PORT: the server's cmd_get + cmd_set
    echo $(( $(stat "$1" cmd_get) + $(stat "$1" cmd_set) ))
}
hz=$(getconf CLK_TCK)
rps() { # rps JSON: requests/s of the run
    python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); o=r["ours"]; k=["cmd_get","cmd_set","delete_hits+misses","cmd_touch","incr_hits+misses"]; print(round(sum(o.get(x,0) for x in k)/r["seconds"]))' "$1"
}

attach() { # attach MASTER_PORT: start $replicas replicas of it on core 1; ports in rports
    rports=()
    for _ in $(seq "$replicas"); do
        local p; p=$(free_port)
        nice_cmd=$replica_nice start 1 "$p" --replica-of "127.0.0.1:$1" >/dev/null
        rports+=("$p")
    done
}
stop_all() { cleanup; for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done; pids=(); }
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

echo "machine: $(nproc) cores; $(uname -r); $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
tmp=$(mktemp -d)
if [ "$skip" = 0 ]; then
echo "== master throughput, no replica vs $replicas replicas (memaslap mix, 50 conns, ${duration}s, $rounds rounds; replicas ${replica_nice:-at equal priority})"
none=(); some=(); none_us=(); some_us=()
for r in $(seq "$rounds"); do
    for mode in none some; do
        mport=$(free_port)
        start 0 "$mport" >/dev/null
        mpid=$started
        if [ "$mode" = some ]; then attach "$mport"; fi
        t0=$(cpu_ticks "$mpid"); q0=$(served "$mport")
        taskset -c 1 "$kvblast" run -q --workload memaslap --keys 100000 --load -c 50 \
            -D "${duration}s" --json "$tmp/$mode.json" "127.0.0.1:$mport" >/dev/null
        t1=$(cpu_ticks "$mpid"); q1=$(served "$mport")
        x=$(rps "$tmp/$mode.json")
        us=$(python3 -c "print(f'{($t1 - $t0) / $hz / max($q1 - $q0, 1) * 1e6:.3f}')")
        if [ "$mode" = none ]; then none+=("$x"); none_us+=("$us"); else some+=("$x"); some_us+=("$us"); fi
        echo "round $r $mode: $x req/s; master CPU $us us/request"
        stop_all
    done
done
mn=$(median "${none[@]}"); ms=$(median "${some[@]}")
echo "median no replica: $mn req/s; $replicas replicas: $ms req/s; ratio $(python3 -c "print(round($ms/$mn, 3))")"
un=$(median "${none_us[@]}"); us=$(median "${some_us[@]}")
echo "median master CPU per request: no replica $un us; $replicas replicas $us us; capacity ratio (no replica / replicas) $(python3 -c "print(round($un/$us, 3))")"
fi
fill_to_steady_state() { # PORT: write 2 GiB of sets (-m is 1024), then wait (60 s at most)
    # until every replica attached has caught up
    local mport=$1 n lagging=0
    n=$(( (2048 << 20) / (value + 64) ))
    taskset -c "$lag_load_core" "$kvblast" run -q --workload fixedsize --value-size "$value" \
        --keys 100000 --mix set=1 -c 50 -n "$n" "127.0.0.1:$mport" >/dev/null
    for _ in $(seq 1 600); do
        lagging=0
        for i in $(seq 0 $(( $(stat "$mport" connected_replicas replication) - 1 ))); do
            [ "$(stat "$mport" "replica${i}_lag_bytes" replication)" = 0 ] || lagging=$((lagging + 1))
        done
        [ "$lagging" = 0 ] && break
        sleep 0.1
    done
    echo "filled: $n sets written; replicas caught up: $([ "$lagging" = 0 ] && echo yes || echo NO)"
}
[ "$rates" = none ] && rates=""
if [ "$rates" = half ]; then
    echo "== master set capacity, ${value}-byte values, no replica (closed loop, 50 conns, ${duration}s, kvblast on core $lag_load_core$([ "$fill" = 1 ] && echo ', after a fill'))"
    mport=$(free_port)
    start 0 "$mport" >/dev/null
    [ "$fill" = 1 ] && fill_to_steady_state "$mport"
    taskset -c "$lag_load_core" "$kvblast" run -q --workload fixedsize --value-size "$value" --keys 100000 \
        --mix set=1 -c 50 -D "${duration}s" --json "$tmp/cap.json" "127.0.0.1:$mport" >/dev/null
    cap=$(rps "$tmp/cap.json")
    stop_all
    rates=$((cap / 2))
    echo "capacity $cap sets/s; lag measured at half: $rates sets/s"
fi
lag_run() {
local rate=$1
echo "== replication lag, $replicas replicas: sets of ${value}-byte values at $rate/s for ${duration}s"
mport=$(free_port); start 0 "$mport" >/dev/null
attach "$mport"
[ "$fill" = 1 ] && fill_to_steady_state "$mport"
taskset -c "$lag_load_core" "$kvblast" run -q --workload fixedsize --value-size "$value" --keys 100000 \
    --mix set=1 --rate "$rate" -c 8 -D "${duration}s" --json "$tmp/lag.json" \
    "127.0.0.1:$mport" >/dev/null &
load=$!
python3 - "$mport" "$load" "${rports[@]}" >"$tmp/lag.txt" <<'PY'
# Every ~50 ms: read the master's view of each replica's lag (stats replication), then set a
# probe key on the master and time how long until each replica returns it (end to end).
import os, socket, sys, time
mport, load, rports = int(sys.argv[1]), int(sys.argv[2]), [int(p) for p in sys.argv[3:]]
def conn(port):
    s = socket.create_connection(("127.0.0.1", port)); s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s, s.makefile("rb")
ms, mf = conn(mport)
reps = [conn(p) for p in rports]
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
    t0 = time.perf_counter()
    seen = [None] * len(reps)
    while time.perf_counter() - t0 < 5 and None in seen:
        for j, (rs, rf) in enumerate(reps):
            if seen[j] is not None: continue
            rs.sendall(b"get " + key + b"\r\n"); first = rf.readline()
            if first.startswith(b"VALUE"):
                rf.readline(); rf.readline(); seen[j] = time.perf_counter() - t0
        time.sleep(0.0005)
    row = []
    for j in range(len(reps)):
        row += [st.get(f"replica{j}_lag_bytes", "0"), st.get(f"replica{j}_lag_seconds", "0"),
                "%.6f" % (seen[j] if seen[j] is not None else 5.0)]
    print(*row, flush=True)
    time.sleep(0.05)
PY
wait "$load" || true
echo "achieved $(rps "$tmp/lag.json") sets/s"
python3 - "$tmp/lag.txt" <<'PY'
import sys
rows = [list(map(float, l.split())) for l in open(sys.argv[1]) if l.strip()]
def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(p * len(v)))] if v else 0
n = len(rows[0]) // 3 if rows else 0
print(f"samples {len(rows)}")
for j in range(n):
    b = [r[3*j] for r in rows]; s = [r[3*j+1] for r in rows]; e = [r[3*j+2] for r in rows]
    print(f"replica{j}: lag bytes p50 {pct(b,.5):.0f} p99 {pct(b,.99):.0f} max {max(b, default=0):.0f}; "
          f"lag seconds (stats) p50 {pct(s,.5):.3f} p99 {pct(s,.99):.3f} max {max(s, default=0):.3f}; "
          f"end-to-end p50 {pct(e,.5)*1000:.1f} ms p99 {pct(e,.99)*1000:.1f} ms max {max(e, default=0)*1000:.1f} ms")
PY
stop_all
}
for r in ${rates//,/ }; do lag_run "$r"; done
