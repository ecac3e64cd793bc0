#!/usr/bin/env bash
# Side-by-side throughput and CPU cost of kvcached and Debian's memcached, in one run.
#
# Each server runs with one worker thread pinned to one core; the load generator is pinned to
# the other core. The same load runs against each server in turn, ROUNDS times, alternating
# (memcached, kvcached, memcached, ...) so that a noisy neighbour hurts both alike. For each run
# it reports requests/s (from the server's own cmd_get + cmd_set + cmd_touch counters; a gat
# counts as a touch), the server's CPU
# time per request (user + system, from /proc) and how busy its core was, and the load
# generator's CPU time per request; then the kvcached/memcached ratios of the medians. It also
# reports the server core's busy time per request (core_us/req, from /proc/stat): the process's
# CPU plus any kernel receive work that core ran while the server slept (softirqs in the idle
# task are not charged to a process), which is the figure to compare with -n.
#
# usage: bench/compare.sh [-d SECONDS] [-r ROUNDS] [-c CONNS] [-l memcaslap|kvblast] [-u] [-s] [-n] [-- LOAD ARGS]
#   -n: as two machines (root): the server and the load generator in two network namespaces
#       joined by a veth pair, each end's receive work steered to its own side's core (see
#       netns_setup in bench/lib.sh). On loopback the sender's core runs the receiver's kernel
#       work too, so every reply's delivery is charged to the server.
#   -s: TLS cost (kvblast only): each round runs both servers in plaintext and over TLS (-Z,
#       a throwaway certificate made with openssl; kvblast --tls-insecure; stats are read on a
#       notls: listener), and the report adds each server's TLS/plaintext ratio.
#   -u: UDP (both servers get -U; kvblast sends to udp:HOST:PORT; default load: the USR
#       workload's GETs over 100,000 keys, which are set over TCP before the measurement).
#   memcaslap (libmemcached-tools): its default mix, 90% get / 10% set, the OSv benchmark's.
#   kvblast: the project's own generator, closed loop; LOAD ARGS are passed to `kvblast run`
#   (default: --workload etc --keys 100000 --look-aside).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh

duration=10
rounds=3
conns=50
load=memcaslap
udp=0
tls=0
netns=0
while getopts "d:r:c:l:usn" opt; do
    case $opt in
        d) duration=$OPTARG ;;
        r) rounds=$OPTARG ;;
        c) conns=$OPTARG ;;
        l) load=$OPTARG ;;
        u) udp=1 ;;
        s) tls=1 ;;
        n) netns=1 ;;
        *) echo "usage: $0 [-d SECONDS] [-r ROUNDS] [-c CONNS] [-l memcaslap|kvblast] [-u] [-s] [-n] [-- LOAD ARGS]" >&2; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
extra=("$@")

server_core=1
load_core=0
[ "$(nproc)" -ge 2 ] || { server_core=0; echo "warning: one core: server and load share it" >&2; }

if [ "$load" = kvblast ]; then
    cargo build --release -q -p kvcached -p kvblast
else
    cargo build --release -q -p kvcached
fi
# Binaries from CARGO_TARGET_DIR if set; KVCACHED runs another kvcached (e.g. an older build).
target=${CARGO_TARGET_DIR:-target}
kvcached=${KVCACHED:-$target/release/kvcached}
kvblast=$target/release/kvblast
memcached=${MEMCACHED:-/usr/bin/memcached}
mc_version=$("$memcached" -V | awk '{print $2}')





# cpu_of COMMAND...: run it quietly; print the CPU seconds (user + system) it used.
cpu_of() {
    python3 -c 'import resource, subprocess, sys
subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
r = resource.getrusage(resource.RUSAGE_CHILDREN)
print(r.ru_utime + r.ru_stime)' "$@"
}

run_load() { # PORT MODE; prints the load generator's CPU seconds
    local port=$1 mode=$2
    local tls_args=()
    [ "$mode" = tls ] && tls_args=(--tls-insecure)
    case $load in
        memcaslap)
            cpu_of "${in_load[@]}" timeout $((duration + 30)) taskset -c $load_core memcaslap -s "$bench_host:$port" -T 1 \
                -c "$conns" -t "${duration}s" "${extra[@]}" ;;
        kvblast)
            local target="$bench_host:$port"
            if [ $udp = 1 ]; then
                target="udp:$target"
                [ ${#extra[@]} -gt 0 ] || extra=(--workload usr --keys 100000 --mix get=1)
            fi
            # Default workload: Facebook ETC sizes, 100k keys, look-aside (get; set on a miss).
            [ ${#extra[@]} -gt 0 ] || extra=(--workload etc --keys 100000 --look-aside)
            cpu_of "${in_load[@]}" timeout $((duration + 30)) taskset -c $load_core "$kvblast" run -q \
                --no-server-stats "${tls_args[@]}" -c "$conns" -D "${duration}s" "${extra[@]}" "$target" ;;
        *) echo "unknown load generator $load" >&2; exit 2 ;;
    esac
}

hz=$(getconf CLK_TCK)
results=$(mktemp)
certdir=$(mktemp -d)
trap 'rm -f "$results"; rm -rf "$certdir"; [ -n "${pid:-}" ] && kill "$pid" 2>/dev/null; netns_teardown' EXIT
if [ $netns = 1 ]; then
    [ "$(nproc)" -ge 2 ] || { echo "-n needs two cores" >&2; exit 2; }
    netns_setup $server_core $load_core
fi
modes=plain
if [ $tls = 1 ]; then
    [ "$load" = kvblast ] && [ $udp = 0 ] || { echo "-s needs -l kvblast over TCP" >&2; exit 2; }
    modes="plain tls"
    # A throwaway P-256 certificate (not a CA: rustls refuses a CA as a server certificate).
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
        -keyout "$certdir/key.pem" -out "$certdir/cert.pem" -subj /CN=localhost \
        -addext subjectAltName=DNS:localhost,IP:127.0.0.1 -addext basicConstraints=critical,CA:FALSE \
        2>/dev/null
fi

for round in $(seq 1 "$rounds"); do
  for mode in $modes; do
    for server in memcached kvcached; do
        port=$(free_port)
        sport=$port
        bin=$memcached
        [ $server = kvcached ] && bin=$kvcached
        udp_args=()
        [ $udp = 1 ] && udp_args=(-U "$port")
        tls_args=()
        if [ "$mode" = tls ]; then
            sport=$(free_port)
            tls_args=(-Z -o "ssl_chain_cert=$certdir/cert.pem,ssl_key=$certdir/key.pem"
                -l "notls:$bench_host:$sport")
        fi
        "${in_srv[@]}" taskset -c $server_core "$bin" "${user_args[@]}" -l "$bench_host" -p "$port" "${udp_args[@]}" \
            "${tls_args[@]}" -t 1 -m 1024 -c 4096 &
        pid=$!
        wait_port "$port"
        wait_port "$sport"
        if [ $udp = 1 ] && [ "$load" = kvblast ]; then
            "${in_load[@]}" "$kvblast" run -q --no-server-stats --workload usr --keys 100000 \
                --mix set=1 --popularity sequential -c 8 -d 8 -n 100000 "$bench_host:$port" >/dev/null
        fi
        t0=$(cpu_ticks $pid); b0=$(cpu_busy $server_core)
        g0=$(stat "$sport" cmd_get); s0=$(( $(stat "$sport" cmd_set) + $(stat "$sport" cmd_touch) ))
        start=$(date +%s.%N)
        load_cpu=$(run_load "$port" "$mode")
        end=$(date +%s.%N)
        g1=$(stat "$sport" cmd_get); s1=$(( $(stat "$sport" cmd_set) + $(stat "$sport" cmd_touch) ))
        t1=$(cpu_ticks $pid); b1=$(cpu_busy $server_core)
        kill "$pid"; wait "$pid" 2>/dev/null || true; pid=
        label=$server
        [ "$mode" = tls ] && label=$server-tls
        python3 - "$label" "$round" "$start" "$end" "$g0" "$g1" "$s0" "$s1" "$t0" "$t1" "$hz" "$load_cpu" "$b0" "$b1" >>"$results" <<'EOF'
import sys
server, rnd, start, end, g0, g1, s0, s1, t0, t1, hz, load_cpu, b0, b1 = sys.argv[1:]
reqs = (int(g1) - int(g0)) + (int(s1) - int(s0))
secs = float(end) - float(start)
cpu = (int(t1) - int(t0)) / int(hz)
print(server, rnd, reqs, f"{reqs / secs:.0f}", f"{cpu / max(reqs, 1) * 1e6:.3f}", f"{cpu / secs * 100:.0f}",
      f"{float(load_cpu) / max(reqs, 1) * 1e6:.3f}",
      f"{(int(b1) - int(b0)) / int(hz) / max(reqs, 1) * 1e6:.3f}")
EOF
    done
  done
done

proto=TCP
[ $udp = 1 ] && proto=UDP
link="loopback"
[ $netns = 1 ] && link="a veth pair between two network namespaces (-n)"
echo "load: $load over $proto on $link, $conns connections, ${duration}s per run, $rounds rounds; $(nproc) cores; server on core $server_core, load on core $load_core"
echo "memcached: $memcached $mc_version (1 worker thread); kvcached: $($kvcached -V) (1 worker thread)"
printf '%-14s %5s %12s %12s %14s %9s %16s %14s\n' server round requests "req/s" "cpu_us/req" "cpu_%" "load_cpu_us/req" "core_us/req"
while read -r s r n rps us pct lus cus; do
    printf '%-14s %5s %12s %12s %14s %9s %16s %14s\n' "$s" "$r" "$n" "$rps" "$us" "$pct" "$lus" "$cus"
done <"$results"
python3 - "$results" <<'EOF'
import sys, statistics
rows = [l.split() for l in open(sys.argv[1])]
def med(server, col):
    return statistics.median(float(r[col]) for r in rows if r[0] == server)
tls = any(r[0].endswith("-tls") for r in rows)
for suffix in (["", "-tls"] if tls else [""]):
    for name, col in (("req/s", 3), ("cpu_us/req", 4), ("core_us/req", 7)):
        m, k = med("memcached" + suffix, col), med("kvcached" + suffix, col)
        print(f"median {name}{' over TLS' if suffix else ''}: memcached {m:.3f}  kvcached {k:.3f}  kvcached/memcached {k / m:.2f}")
if tls:
    for s in ("memcached", "kvcached"):
        p, t = med(s, 4), med(s + "-tls", 4)
        print(f"TLS cost, {s}: cpu_us/req {p:.3f} plaintext, {t:.3f} TLS: +{t - p:.3f} us/req ({t / p:.2f}x)")
EOF
