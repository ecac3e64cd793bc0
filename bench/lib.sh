# Helpers shared by the bench/ scripts (sourced, not run).

# A TCP port on 127.0.0.1 that was free a moment ago.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# Where the server listens, and a command prefix that runs a command beside it: loopback and
# nothing by default; the server's network namespace after netns_setup.
bench_host=127.0.0.1
in_srv=()
in_load=()

# stat PORT NAME [GROUP]: one value of the server's general `stats` (or `stats GROUP`).
stat() {
    "${in_srv[@]}" python3 - "$1" "$2" "${3:-}" "$bench_host" <<'PY'
import socket, sys
s = socket.create_connection((sys.argv[4], int(sys.argv[1])), timeout=5)
s.sendall(f"stats {sys.argv[3]}".strip().encode() + b"\r\n")
buf = b""
while not buf.endswith(b"END\r\n"):
    d = s.recv(65536)
    if not d:
        break
    buf += d
for line in buf.decode().splitlines():
    p = line.split()
    if len(p) == 3 and p[1] == sys.argv[2]:
        print(p[2])
PY
}

# cpu_ticks PID: user + system clock ticks of a process.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

# wait_port PORT [SECONDS]: poll until something accepts on it (10 s at most, or SECONDS).
wait_port() {
    for _ in $(seq 1 $((${2:-10} * 20))); do
        "${in_srv[@]}" python3 -c "import socket; socket.create_connection(('$bench_host',$1),timeout=0.2)" 2>/dev/null && return 0
        sleep 0.05
    done
    echo "server on port $1 did not start" >&2
    return 1
}

# As root, both servers need -u (memcached refuses root without it; kvcached too).
user_args=()
[ "$(id -u)" -eq 0 ] && user_args=(-u root)

# bench_binaries: build kvcached and kvblast, then set kvcached ($KVCACHED, or the build under
# CARGO_TARGET_DIR), kvblast, memcached ($MEMCACHED, or Debian's), and the cores: the server
# on core 1, the load generator on core 0 (both on core 0, with a warning, on one core).
bench_binaries() {
    cargo build --release -q -p kvcached -p kvblast
    local target=${CARGO_TARGET_DIR:-target}
    kvcached=${KVCACHED:-$target/release/kvcached}
    kvblast=$target/release/kvblast
    memcached=${MEMCACHED:-/usr/bin/memcached}
    server_core=1
    load_core=0
    [ "$(nproc)" -ge 2 ] || { server_core=0; echo "warning: one core: server and load share it" >&2; }
}

# cpu_busy CPU: clock ticks the CPU spent on anything but idling (user, nice, system, irq,
# softirq; not steal), from /proc/stat. Unlike a process's own CPU time it includes the
# network receive work an interrupt or IPI runs on that core while the process sleeps.
cpu_busy() { awk -v c="cpu$1" '$1 == c {print $2 + $3 + $4 + $7 + $8}' /proc/stat; }

# netns_setup SERVER_CORES LOAD_CORES: two network namespaces joined by a veth pair, as two
# machines on one link: the server's namespace (10.213.0.1) and the load generator's
# (10.213.0.2). Receive Packet Steering on each end runs the kernel's receive work for
# packets arriving there on that side's cores (a request's on the server's, a reply's on
# the load generator's), where on loopback the sender's core runs both sides of every
# packet. Cores are one number or a range (2-5); netns_rps changes them later. Sets
# bench_host, in_srv and in_load; netns_teardown removes it all. Needs root.
netns_setup() {
    local tag=kvb$$ ns
    netns_srv=${tag}s
    netns_load=${tag}c
    ip netns add "$netns_srv"
    ip netns add "$netns_load"
    ip link add "${tag}s0" type veth peer name "${tag}c0"
    ip link set "${tag}s0" netns "$netns_srv"
    ip link set "${tag}c0" netns "$netns_load"
    ip -n "$netns_srv" addr add 10.213.0.1/30 dev "${tag}s0"
    ip -n "$netns_load" addr add 10.213.0.2/30 dev "${tag}c0"
    for ns in "$netns_srv" "$netns_load"; do
        ip -n "$ns" link set lo up
    done
    ip -n "$netns_srv" link set "${tag}s0" up
    ip -n "$netns_load" link set "${tag}c0" up
    netns_tag=$tag
    bench_host=10.213.0.1
    in_srv=(ip netns exec "$netns_srv")
    in_load=(ip netns exec "$netns_load")
    netns_rps "$1" "$2"
}

# cpu_mask CORES: the hexadecimal mask of one core (3) or a range of them (2-5).
cpu_mask() {
    local lo=${1%-*} hi=${1#*-}
    printf '%x' $(((1 << (hi + 1)) - (1 << lo)))
}

# netns_rps SERVER_CORES LOAD_CORES: which cores run each side's receive work (see
# netns_setup).
netns_rps() {
    "${in_srv[@]}" sh -c "echo $(cpu_mask "$1") > /sys/class/net/${netns_tag}s0/queues/rx-0/rps_cpus"
    "${in_load[@]}" sh -c "echo $(cpu_mask "$2") > /sys/class/net/${netns_tag}c0/queues/rx-0/rps_cpus"
}

netns_teardown() {
    [ -n "${netns_srv:-}" ] && ip netns del "$netns_srv" 2>/dev/null
    [ -n "${netns_load:-}" ] && ip netns del "$netns_load" 2>/dev/null
    netns_srv= netns_load=
    return 0
}
