#!/usr/bin/env bash
# Scaling with cores (issue 46, item 5): kvcached and memcached with `-t N`, pinned to N
# cores, the load generator pinned to the others, for N = 1, 2, 4, ... while the generator
# keeps at least N cores (N <= cores / 2; on 2 cores that is N = 1 alone). GETs, by default
# of 32-byte values over 100,000 preloaded keys, closed loop. For each N and server it reports GET/s
# (from the server's own cmd_get over the run), the server's CPU per GET (user + system from
# /proc) and how many of its cores it kept busy; then the medians of ROUNDS rounds (the
# servers alternate, the first one swapped every round) and kvcached/memcached ratios.
#
#   [MEMCACHED=PATH] [KVCACHED=PATH] [MEMTIER=PATH] bench/scaling.sh [-d SECONDS] [-r ROUNDS]
#       [-g kvblast|memtier] [-c CONNS_PER_SERVER_CORE] [-p DEPTH] [-m MAX_N] [-R RATE]
#       [-v VALUE_BYTES] [-k KEYS] [-n] [-S] [-T]
#
#   -g: the load generator: kvblast (default; its closed loop with a window of DEPTH
#       requests per connection) or memtier_benchmark (MEMTIER, or memtier_benchmark on the
#       PATH; --pipeline=DEPTH), each with one thread per load core.
#   -c: connections per server core (default 50), spread over the generator's threads.
#   -p: requests in flight per connection (default 1).
#   -m: the largest N to try (default: cores / 2).
#   -R: open loop at RATE GETs/s per server core instead of the closed loop (kvblast --rate,
#       Poisson arrivals; memtier --rate-limiting, RATE spread over the connections), to
#       compare CPU per GET at a load below capacity.
#   -v, -k: value size (default 32 bytes) and keys (default 100,000; keep KEYS x VALUE_BYTES
#       well inside the servers' -m 1024).
#   -S: SETs of VALUE_BYTES over KEYS keys instead of GETs (counted by cmd_set; rates and
#       figures are then per SET).
#   -T: over TLS (-Z with a throwaway P-256 certificate made by openssl; memtier --tls
#       --tls-skip-verify, kvblast --tls-insecure); keys are set and stats read on a
#       plaintext notls: listener.
#   -n: as two machines (root): server and generator in two network namespaces joined by a
#       veth pair, each side's receive work on its own cores (netns_setup in bench/lib.sh),
#       not loopback (where the sender's core runs the receiver's kernel work too).
# MEMCACHED defaults to Debian's /usr/bin/memcached; the reference build
# (~/.cache/kvcache-ref/memcached) is memcached 1.6.45. The script runs unchanged on 2 to
# 64 cores (it reads the count from nproc).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh

duration=10
rounds=3
gen=kvblast
per_core=50
depth=1
max_n=0
rate=0
value=32
keys=100000
netns=0
op=get
tls=0
while getopts "d:r:g:c:p:m:R:v:k:nST" opt; do
    case $opt in
        d) duration=$OPTARG ;;
        r) rounds=$OPTARG ;;
        g) gen=$OPTARG ;;
        c) per_core=$OPTARG ;;
        p) depth=$OPTARG ;;
        m) max_n=$OPTARG ;;
        R) rate=$OPTARG ;;
        v) value=$OPTARG ;;
        k) keys=$OPTARG ;;
        n) netns=1 ;;
        S) op=set ;;
        T) tls=1 ;;
        *) echo "usage: $0 [-d SECONDS] [-r ROUNDS] [-g kvblast|memtier] [-c CONNS] [-p DEPTH] [-m MAX_N] [-R RATE] [-v BYTES] [-k KEYS] [-n] [-S] [-T]" >&2; exit 2 ;;
    esac
done
case $gen in kvblast | memtier) ;; *) echo "unknown generator $gen" >&2; exit 2 ;; esac
OP=${op^^}

cores=$(nproc)
[ "$cores" -ge 2 ] || { echo "scaling needs at least 2 cores" >&2; exit 2; }
[ "$max_n" -gt 0 ] || max_n=$((cores / 2))
bench_binaries
memtier=${MEMTIER:-memtier_benchmark}
if [ "$gen" = memtier ]; then
    command -v "$memtier" >/dev/null || { echo "no memtier_benchmark (set MEMTIER)" >&2; exit 2; }
fi
mc_version=$("$memcached" -V | awk '{print $2}')
hz=$(getconf CLK_TCK)
pid=""
results=$(mktemp)
certdir=$(mktemp -d)
trap 'rm -rf "$results" "$certdir"; [ -n "$pid" ] && kill "$pid" 2>/dev/null; netns_teardown' EXIT
if [ $tls = 1 ]; then
    # A throwaway P-256 certificate (not a CA: rustls refuses a CA as a server certificate).
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
        -keyout "$certdir/key.pem" -out "$certdir/cert.pem" -subj /CN=localhost \
        -addext subjectAltName=DNS:localhost,IP:127.0.0.1,IP:10.213.0.1 \
        -addext basicConstraints=critical,CA:FALSE 2>/dev/null
fi

# The server on cores 0..N-1, the generator on N..cores-1.
server_cpus() { echo "0-$(($1 - 1))"; }
load_cpus() { echo "$1-$((cores - 1))"; }

start_server() { # start_server NAME N PORT: sets sport, the plaintext port
    local bin=$memcached tls_args=()
    [ "$1" = kvcached ] && bin=$kvcached
    sport=$3
    if [ $tls = 1 ]; then
        sport=$(free_port)
        tls_args=(-Z -o "ssl_chain_cert=$certdir/cert.pem,ssl_key=$certdir/key.pem"
            -l "notls:$bench_host:$sport")
    fi
    "${in_srv[@]}" taskset -c "$(server_cpus "$2")" "$bin" "${user_args[@]}" -l "$bench_host" -p "$3" -U 0 \
        "${tls_args[@]}" -t "$2" -m 1024 -c $(($2 * per_core + 1024)) >/dev/null 2>&1 &
    pid=$!
    wait_port "$3"
    wait_port "$sport"
    # The keys each generator reads: kvblast's by its load phase, memtier's (key:N) by a
    # fill run.
    if [ "$gen" = kvblast ]; then
        "${in_load[@]}" taskset -c "$(load_cpus "$2")" "$kvblast" run -q --no-server-stats -w fixedsize \
            --key-size 9 --value-size "$value" --keys "$keys" --load --mix get=1 -c 10 -D 1s \
            "$bench_host:$sport" >/dev/null
    else
        "${in_load[@]}" taskset -c "$(load_cpus "$2")" "$memtier" -s "$bench_host" -p "$sport" -P memcache_text -t 1 \
            -c 1 --ratio=1:0 -d "$value" --key-prefix=key: --key-minimum=1 --key-maximum="$keys" \
            --key-pattern=P:P -n allkeys --hide-histogram >/dev/null 2>&1
    fi
}
stop_server() { kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; pid=""; }

run_load() { # run_load N PORT
    local n=$1 port=$2 threads=$((cores - $1)) conns=$(($1 * per_core))
    local per_thread=$(((conns + threads - 1) / threads))
    local open=() sec=()
    if [ "$gen" = kvblast ]; then
        [ $tls = 1 ] && sec=(--tls-insecure)
        [ "$rate" -gt 0 ] && open=(--rate $((rate * n)))
        "${in_load[@]}" timeout $((duration + 30)) taskset -c "$(load_cpus "$n")" "$kvblast" run -q \
            --no-server-stats -w fixedsize --key-size 9 --value-size "$value" --keys "$keys" \
            --mix $op=1 --popularity uniform --threads "$threads" -c "$per_thread" --depth "$depth" \
            "${open[@]}" "${sec[@]}" -D "${duration}s" "$bench_host:$port" >/dev/null
    else
        [ $tls = 1 ] && sec=(--tls --tls-skip-verify)
        # memtier's limit is per connection.
        [ "$rate" -gt 0 ] && open=(--rate-limiting=$(((rate * n + per_thread * threads - 1) / (per_thread * threads))))
        "${in_load[@]}" timeout $((duration + 30)) taskset -c "$(load_cpus "$n")" "$memtier" -s "$bench_host" \
            -p "$port" -P memcache_text -t "$threads" -c "$per_thread" --pipeline="$depth" \
            "${open[@]}" "${sec[@]}" --ratio="$([ $op = set ] && echo 1:0 || echo 0:1)" -d "$value" --key-prefix=key: --key-minimum=1 \
            --key-maximum="$keys" --key-pattern=R:R --distinct-client-seed \
            --test-time="$duration" --hide-histogram >/dev/null 2>&1
    fi
}

ns=()
for ((n = 1; n <= max_n && n < cores; n *= 2)); do ns+=("$n"); done
[ $netns = 1 ] && netns_setup "$(server_cpus 1)" "$(load_cpus 1)"

echo "machine: $cores cores; $(uname -r); $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
echo "memcached $mc_version ($memcached); kvcached: $("$kvcached" -V); ${OP}s of $value-byte values over $keys keys; generator: $gen, $per_core connections per server core, $depth in flight each, $([ "$rate" -gt 0 ] && echo "open loop at $rate ${OP}s/s per server core" || echo "closed loop"), ${duration}s per run, $rounds rounds, $([ $tls = 1 ] && echo "over TLS, ")over $([ $netns = 1 ] && echo "a veth pair between two network namespaces (-n)" || echo loopback)"
for round in $(seq "$rounds"); do
    for n in "${ns[@]}"; do
        [ $netns = 1 ] && netns_rps "$(server_cpus "$n")" "$(load_cpus "$n")"
        servers=(memcached kvcached)
        [ $((round % 2)) = 0 ] && servers=(kvcached memcached)
        for server in "${servers[@]}"; do
            port=$(free_port)
            start_server "$server" "$n" "$port"
            g0=$(stat "$sport" cmd_$op); c0=$(cpu_ticks "$pid"); t0=$(date +%s.%N)
            run_load "$n" "$port"
            t1=$(date +%s.%N); c1=$(cpu_ticks "$pid"); g1=$(stat "$sport" cmd_$op)
            stop_server
            python3 - "$server" "$n" "$round" "$g0" "$g1" "$c0" "$c1" "$t0" "$t1" "$hz" <<'EOF' | tee -a "$results"
import sys
server, n, rnd, g0, g1, c0, c1, t0, t1, hz = sys.argv[1:]
gets = int(g1) - int(g0)
secs = float(t1) - float(t0)
cpu = (int(c1) - int(c0)) / int(hz)
print(server, n, rnd, f"{gets / secs:.0f}", f"{cpu / max(gets, 1) * 1e6:.3f}", f"{cpu / secs:.2f}")
EOF
        done
    done
done
python3 - "$results" "$OP" <<'EOF'
import sys, statistics
rows = [l.split() for l in open(sys.argv[1])]
op = sys.argv[2]
ns = sorted({int(r[1]) for r in rows})
print(f"{'N':>3} {'memcached ' + op + '/s':>16} {'kvcached ' + op + '/s':>15} {'ratio':>6} "
      f"{'memcached cpu_us/' + op:>21} {'kvcached cpu_us/' + op:>20} {'ratio':>6} {'cores busy (mc/kv)':>19}")
for n in ns:
    def med(server, col):
        return statistics.median(float(r[col]) for r in rows if r[0] == server and int(r[1]) == n)
    mg, kg = med("memcached", 3), med("kvcached", 3)
    mc, kc = med("memcached", 4), med("kvcached", 4)
    mb, kb = med("memcached", 5), med("kvcached", 5)
    print(f"{n:>3} {mg:>16.0f} {kg:>15.0f} {kg / mg:>6.2f} {mc:>21.3f} {kc:>20.3f} {kc / mc:>6.2f} {mb:>9.2f}/{kb:.2f}")
EOF
