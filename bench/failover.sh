#!/usr/bin/env bash
# Warm failover: the hit ratio of a promoted replica right after its master dies, against the
# master's before the kill and against a cold restart's, on the same look-aside workload.
#
# A master (core 0) and its replica (core 1) with the same -m; kvblast (core 1) runs the ETC
# workload in look-aside mode (get; on a miss, set) over KEYS keys: WARM seconds to fill the
# cache, then MEASURE seconds whose hit ratio is the master's. Then the master is killed
# (SIGKILL), the replica promoted (`replicaof no one`), and the same MEASURE-second run goes
# to it. Last, a new empty kvcached gets the same run (a cold restart). Hit ratios come from
# kvblast's own counts (get hits / gets).
#
# usage: bench/failover.sh [-m MB] [-k KEYS] [-w WARM] [-d MEASURE] [-p POPULARITY]
#   defaults: -m 64 -k 1000000 -w 20 -d 2 -p zipf:0.99. The measured window is short on
#   purpose: a cold server refills within seconds under look-aside, so what a warm
#   failover saves is the first seconds after it.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh

mem=64
keys=1000000
warm=20
measure=2
pop=zipf:0.99
while getopts "m:k:w:d:p:" opt; do
    case $opt in
        m) mem=$OPTARG ;;
        k) keys=$OPTARG ;;
        w) warm=$OPTARG ;;
        d) measure=$OPTARG ;;
        p) pop=$OPTARG ;;
        *) echo "usage: $0 [-m MB] [-k KEYS] [-w WARM] [-d MEASURE] [-p POPULARITY]" >&2; exit 2 ;;
    esac
done

cargo build --release -q -p kvcached -p kvblast
bin=${CARGO_TARGET_DIR:-target}/release
user=(); [ "$(id -u)" = 0 ] && user=(-u root)
pids=()
cleanup() { for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
tmp=$(mktemp -d)

start() { # start CORE PORT ARGS...: sets $started to the pid
    local core=$1 port=$2; shift 2
    taskset -c "$core" "$bin/kvcached" "${user[@]}" -l 127.0.0.1 -p "$port" -t 1 -m "$mem" "$@" \
        >/dev/null 2>&1 &
    started=$!
    pids+=("$started")
    wait_port "$port"
}
run() { # run PORT SECONDS JSON
    taskset -c 1 "$bin/kvblast" run -q --workload etc --keys "$keys" --popularity "$pop" \
        --look-aside -c 20 -D "$2s" --json "$3" "127.0.0.1:$1" >/dev/null
}
ratio() { # ratio JSON: get hits / gets
    python3 -c 'import json,sys; o=json.load(open(sys.argv[1]))["ours"]; print("%.4f" % (o["get_hits"]/max(1,o["cmd_get"])))' "$1"
}
lag() { # lag PORT: the master's replica0_lag_bytes
    printf 'stats replication\r\n' | python3 -c '
import socket,sys
s=socket.create_connection(("127.0.0.1",int(sys.argv[1]))); s.sendall(b"stats replication\r\n"); b=b""
while not b.endswith(b"END\r\n"): b+=s.recv(65536)
print(next((l.split()[2].decode() for l in b.split(b"\r\n") if l.startswith(b"STAT replica0_lag_bytes")), "?"))' "$1"
}

echo "machine: $(nproc) cores; -m $mem, $keys keys ($pop), ETC look-aside, warm ${warm}s, measure ${measure}s"
mport=$(free_port); start 0 "$mport"; master=$started
rport=$(free_port); start 1 "$rport" --replica-of "127.0.0.1:$mport"; replica=$started
run "$mport" "$warm" "$tmp/warm.json"
run "$mport" "$measure" "$tmp/master.json"
echo "replica lag at the kill: $(lag "$mport") bytes"
kill -9 "$master"; wait "$master" 2>/dev/null || true
t0=$(date +%s%N)
printf 'replicaof no one\r\n' | python3 -c '
import socket,sys
s=socket.create_connection(("127.0.0.1",int(sys.argv[1]))); s.sendall(b"replicaof no one\r\n")
assert s.recv(100)==b"OK\r\n"' "$rport"
echo "promotion took $(( ($(date +%s%N) - t0) / 1000000 )) ms"
run "$rport" "$measure" "$tmp/promoted.json"
cport=$(free_port); start 0 "$cport"
run "$cport" "$measure" "$tmp/cold.json"
m=$(ratio "$tmp/master.json"); p=$(ratio "$tmp/promoted.json"); c=$(ratio "$tmp/cold.json")
echo "hit ratio: master before the kill $m; promoted replica $p; cold restart $c"
python3 -c "print('promoted/master %.3f; cold/master %.3f' % ($p/$m, $c/$m))"
