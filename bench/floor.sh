#!/usr/bin/env bash
# The kernel's floor under a GET server, beside kvcached and the reference, in one run.
#
# examples/floor.rs answers every get with a canned value and does nothing else, through the
# same interfaces kvcached uses (UDP: recvmmsg/sendmmsg; TCP: io_uring with multishot accept
# and receive into provided buffers, one submission per loop iteration). Its CPU per request
# is what the kernel's network path costs alone: no server on these interfaces goes below it.
# The three servers run in turn, ROUNDS times, each pinned to core 1 with one thread, the
# load generator (kvblast, closed loop) on core 0. Requests are kvblast's count for the
# measured window; CPU is the server's user + system time over that window (a TCP load's
# keys are set before it, except on the floor, which stores nothing).
#
# usage: bench/floor.sh [-u] [-n] [-g kvblast|memtier] [-p DEPTH] [-d SECONDS] [-r ROUNDS] [-c CONNS]
#                       [-v VALUE_BYTES] [-V VARIANTS] [-- LOAD ARGS]
#   -u: UDP (default load: the USR workload's GETs over 100,000 keys, 2-byte values)
#   -n: as two machines (root): across a veth pair between two network namespaces, each
#       side's receive work on its own core (netns_setup in bench/lib.sh), not loopback
#   TCP default load: --mix get=1 --value-size 32 --keys 100000 --popularity uniform --depth 1
#   -v: the floor's value size (default: 32 over TCP, 2 over UDP; match LOAD ARGS)
#   -g memtier: memtier_benchmark ($MEMTIER) as the load instead of kvblast (TCP only):
#       GETs over 100,000 `key:N` keys (set by a memtier fill run, except on the floor),
#       one thread, --pipeline=DEPTH (-p, default 1), closed loop unless LOAD ARGS add
#       --rate-limiting=N (per connection); requests are memtier's GET/s times the run's
#       length.
#   -V: more floor servers in each round, with techniques the plain floor does not use
#       (TCP): `fixed` (connections in io_uring's registered file table) and `gather=N:U`
#       (each wait asks for the turn's sends and N more completions, returning after U
#       microseconds with whatever came: io_uring's minimum wait; U = 0: no minimum);
#       e.g. -V "fixed gather=4:20"
# Besides CPU per request it reports each run's p50 and p99 latency (the generator's, in µs).
# The reference is $MEMCACHED (default: Debian's /usr/bin/memcached); $KVCACHED runs another
# kvcached build.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh

duration=5
rounds=5
conns=50
udp=0
netns=0
vbytes=
gen=kvblast
depth=1
variants=
while getopts "und:r:c:v:g:p:V:" opt; do
    case $opt in
        u) udp=1 ;;
        n) netns=1 ;;
        d) duration=$OPTARG ;;
        r) rounds=$OPTARG ;;
        c) conns=$OPTARG ;;
        v) vbytes=$OPTARG ;;
        g) gen=$OPTARG ;;
        p) depth=$OPTARG ;;
        V) variants=$OPTARG ;;
        *) echo "usage: $0 [-u] [-n] [-g kvblast|memtier] [-p DEPTH] [-d SECONDS] [-r ROUNDS] [-c CONNS] [-v VALUE_BYTES] [-V VARIANTS] [-- LOAD ARGS]" >&2; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
extra=("$@")
case $gen in kvblast | memtier) ;; *) echo "unknown generator $gen" >&2; exit 2 ;; esac
servers=(floor)
for v in $variants; do
    case $v in
        fixed | gather=*:*) servers+=("floor:$v") ;;
        *) echo "unknown floor variant $v (fixed, gather=N:U)" >&2; exit 2 ;;
    esac
done
servers+=(kvcached memcached)
if [ -n "$variants" ] && [ $udp = 1 ]; then
    echo "-V is TCP only" >&2; exit 2
fi
if [ "$gen" = memtier ] && [ $udp = 1 ]; then
    echo "-g memtier is TCP only (memtier_benchmark has no memcache UDP)" >&2; exit 2
fi
keys=100000
if [ $udp = 1 ]; then
    mode=udp
    [ ${#extra[@]} -gt 0 ] || extra=(--workload usr --keys $keys --mix get=1)
    vbytes=${vbytes:-2}
    fill=(--workload usr)
elif [ "$gen" = memtier ]; then
    mode=tcp
    vbytes=${vbytes:-32}
    memtier=${MEMTIER:-memtier_benchmark}
    command -v "$memtier" >/dev/null || { echo "no memtier_benchmark (set MEMTIER)" >&2; exit 2; }
else
    mode=tcp
    [ ${#extra[@]} -gt 0 ] || extra=(--mix get=1 --value-size 32 --keys $keys --popularity uniform --depth 1)
    vbytes=${vbytes:-32}
    fill=(--value-size "$vbytes")
fi

bench_binaries
cargo build --release -q --example floor
floor=${CARGO_TARGET_DIR:-target}/release/examples/floor
mc_version=$("$memcached" -V | awk '{print $2}')

results=$(mktemp)
ready=$(mktemp)
trap 'rm -f "$results" "$ready"; [ -n "${pid:-}" ] && kill "$pid" 2>/dev/null; netns_teardown' EXIT
hz=$(getconf CLK_TCK)
if [ $netns = 1 ]; then
    [ "$(nproc)" -ge 2 ] || { echo "-n needs two cores" >&2; exit 2; }
    netns_setup $server_core $load_core
fi

for round in $(seq 1 "$rounds"); do
    for server in "${servers[@]}"; do
        port=$(free_port)
        target=$bench_host:$port
        [ $udp = 1 ] && target=udp:$target
        case $server in
            floor*)
                : >"$ready"
                env=()
                case $server in
                    floor:fixed) env=(FLOOR_FIXED=1) ;;
                    floor:gather=*) env=(FLOOR_GATHER="${server#floor:gather=}") ;;
                esac
                "${in_srv[@]}" env "${env[@]}" taskset -c $server_core "$floor" $mode "$port" "$vbytes" "$bench_host" >"$ready" &
                pid=$!
                for _ in $(seq 1 200); do
                    grep -q ready "$ready" && break
                    sleep 0.05
                done
                grep -q ready "$ready" || { echo "the floor server did not start" >&2; exit 1; } ;;
            *)
                bin=$memcached
                [ $server = kvcached ] && bin=$kvcached
                udp_args=()
                [ $udp = 1 ] && udp_args=(-U "$port")
                "${in_srv[@]}" taskset -c $server_core "$bin" "${user_args[@]}" -l "$bench_host" -p "$port" "${udp_args[@]}" \
                    -t 1 -m 1024 -c 4096 &
                pid=$!
                wait_port "$port"
                if [ "$gen" = memtier ]; then
                    "${in_load[@]}" "$memtier" -s "$bench_host" -p "$port" -P memcache_text -t 1 -c 1 \
                        --ratio=1:0 -d "$vbytes" --key-prefix=key: --key-minimum=1 --key-maximum=$keys \
                        --key-pattern=P:P -n allkeys --hide-histogram >/dev/null 2>&1
                else
                    "${in_load[@]}" "$kvblast" run -q --no-server-stats "${fill[@]}" --keys $keys --mix set=1 \
                        --popularity sequential -c 8 -d 8 -n $keys "$bench_host:$port" >/dev/null
                fi ;;
        esac
        t0=$(cpu_ticks $pid)
        if [ "$gen" = memtier ]; then
            out=$("${in_load[@]}" timeout $((duration + 30)) taskset -c $load_core "$memtier" -s "$bench_host" \
                -p "$port" -P memcache_text -t 1 -c "$conns" --pipeline="$depth" --ratio=0:1 \
                --key-prefix=key: --key-minimum=1 --key-maximum=$keys --key-pattern=R:R \
                --test-time="$duration" --hide-histogram "${extra[@]}" 2>/dev/null)
            t1=$(cpu_ticks $pid)
            n=$(awk -v d="$duration" '$1 == "Gets" {printf "%d", $2 * d}' <<<"$out")
            lat=$(awk '$1 == "Gets" {printf "%.1f %.1f", $6 * 1000, $7 * 1000}' <<<"$out")
            errs=0
        else
            out=$("${in_load[@]}" timeout $((duration + 30)) taskset -c $load_core "$kvblast" run --no-server-stats \
                -c "$conns" -D "${duration}s" "${extra[@]}" "$target" 2>&1)
            t1=$(cpu_ticks $pid)
            n=$(awk '$1 == "all" {print $2}' <<<"$out")
            errs=$(awk '$1 == "all" {print $6}' <<<"$out")
            lat=$(awk '$1 == "all" {print $11, $14}' <<<"$out")
        fi
        kill "$pid"; wait "$pid" 2>/dev/null || true; pid=
        [ -n "$n" ] && [ "$n" -gt 0 ] || { echo "no requests counted against $server:" >&2; echo "$out" >&2; exit 1; }
        echo "$server $round $n $((t1 - t0)) ${errs:-0} ${lat:-- -}" >>"$results"
    done
done

link=loopback
[ $netns = 1 ] && link="a veth pair between two network namespaces (-n)"
echo "load: $([ "$gen" = memtier ] && echo "memtier_benchmark (--pipeline=$depth ${extra[*]})" || echo kvblast) over ${mode^^} on $link, $conns connections, ${duration}s per run, $rounds rounds; $(nproc) cores; server on core $server_core, load on core $load_core"
echo "floor: examples/floor.rs ($mode, $vbytes-byte canned value); kvcached: $($kvcached -V); reference: $memcached $mc_version (1 worker thread each)"
python3 - "$results" "$duration" "$hz" <<'EOF'
import sys, statistics
rows = [l.split() for l in open(sys.argv[1])]
secs, hz = float(sys.argv[2]), int(sys.argv[3])
w = max(10, *(len(r[0]) for r in rows))
print(f"{'server':<{w}} {'round':>5} {'requests':>10} {'req/s':>9} {'cpu_us/req':>11} {'cpu_%':>6} {'errors':>6} {'p50_us':>8} {'p99_us':>8}")
per = {}
for s, r, n, ticks, errs, p50, p99 in rows:
    n, cpu = int(n), int(ticks) / hz
    us = cpu / n * 1e6
    lat = [float(x) if x != "-" else float("nan") for x in (p50, p99)]
    per.setdefault(s, []).append((n / secs, us, *lat))
    print(f"{s:<{w}} {r:>5} {n:>10} {n / secs:>9.0f} {us:>11.3f} {cpu / secs * 100:>6.0f} {errs:>6} {p50:>8} {p99:>8}")
med = {s: [statistics.median(x[i] for x in v) for i in range(4)] for s, v in per.items()}
ref = med["memcached"][1]
for s in per:
    rps, us, p50, p99 = med[s]
    print(f"median {s}: {rps:.0f} req/s, {us:.3f} cpu_us/req, {us / ref:.2f} of the reference's CPU per request, p50 {p50:.1f} µs, p99 {p99:.1f} µs")
for s in per:
    if s != "floor":
        print(f"{s} over the floor: {med[s][1] / med['floor'][1]:.2f}")
EOF
