# Helpers shared by the bench/ scripts (sourced, not run).

# A TCP port on 127.0.0.1 that was free a moment ago.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# stat PORT NAME [GROUP]: one value of the server's general `stats` (or `stats GROUP`).
stat() {
    python3 - "$1" "$2" "${3:-}" <<'PY'
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=5)
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
        python3 -c "import socket; socket.create_connection(('127.0.0.1',$1),timeout=0.2)" 2>/dev/null && return 0
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
