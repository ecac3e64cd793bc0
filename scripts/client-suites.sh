#!/usr/bin/env bash
# Runs memcached client libraries' own test suites against kvcached and against a reference
# memcached, and reports every test that passes on the reference and fails on kvcached:
#
#   scripts/client-suites.sh [-s SERVER] [-r MEMCACHED] [-k DIR] [SUITE...]
#
#   SUITE       default: all of them. Each installs its library, and the tests the library
#               ships with it, from the package registry named (into target/client-suites,
#               kept between runs), starts the servers its tests expect, runs the tests
#               against the reference, then against kvcached, and compares test by test:
#     pymemcache      Python: pymemcache 4.0.0 (PyPI; pymemcache/test in the package):
#                     its integration tests. Text protocol over TCP.
#     bmemcached      Python: python-binary-memcached 0.33.0 (PyPI; test/ in the source
#                     package): binary protocol over TCP, IPv6 and a unix socket, SASL,
#                     and TLS (its TLS tests start `memcached` themselves: they get the
#                     server under test). Its conftest.py is not in the package; this
#                     script writes one that gives the tests the servers it started.
#     rust-memcache   Rust: the memcache crate 0.21.0 (crates.io; tests/ in the crate):
#                     text, binary and meta protocols, UDP, unix sockets, TLS with and
#                     without a client certificate (its own certificates).
#     node-memcached  JavaScript: memcached 2.2.2 (npm; test/ in the package), with mocha:
#                     text protocol, several servers.
#     perl-fast       Perl: Cache::Memcached::Fast (Debian's libcache-memcached-fast-perl)
#                     with the t/ of a checkout of its repository named by CMF_SRC (its
#                     tests are not packaged): text protocol. Skipped without CMF_SRC.
#   -s SERVER   kvcached binary (default target/release/kvcached, built if missing)
#   -r MEMCACHED  the reference (default $MEMCACHED, else /usr/bin/memcached). Built with
#               TLS for rust-memcache's and bmemcached's TLS tests. SASL tests run against
#               $MEMCACHED_SASL (default /usr/bin/memcached: Debian builds it with SASL)
#               with a Cyrus sasldb this script makes (sasl2-bin's saslpasswd2).
#   -k DIR      keep each run's output and results in DIR
#
# The tests expect their servers on fixed ports (11211-11213, 5000, 5001, 12345-12351,
# UDP 22345) and unix sockets (/tmp/memcached.sock, /tmp/memcached2.sock), as their
# projects' CI starts them: a suite whose ports are taken is skipped with a message, as is
# one whose registry cannot be reached or whose tool (python3, cargo, npm, perl) is
# missing. Results are per test (per file for perl-fast). The last line is the summary;
# the exit status is 1 if a test passed on the reference and failed on kvcached, else 0.
# The suites take a few minutes and need the network for the first install, so
# scripts/test.sh does not run them.
set -uo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
server=""
reference=${MEMCACHED:-/usr/bin/memcached}
sasl_reference=${MEMCACHED_SASL:-/usr/bin/memcached}
keep=""
usage() {
    sed -n '2,/^set -uo/{/^set -uo/d;s/^# \{0,1\}//;p}' "$0" >&2
    exit 2
}
while getopts ":s:r:k:h" opt; do
    case $opt in
    s) server=$OPTARG ;;
    r) reference=$OPTARG ;;
    k) keep=$OPTARG ;;
    *) usage ;;
    esac
done
shift $((OPTIND - 1))
all=(pymemcache bmemcached rust-memcache node-memcached perl-fast)
suites=("$@")
((${#suites[@]})) || suites=("${all[@]}")
for s in "${suites[@]}"; do
    [[ " ${all[*]} " == *" $s "* ]] || {
        echo "client-suites.sh: unknown suite $s (${all[*]})" >&2
        exit 2
    }
done

if [[ -z $server ]]; then
    server="$root/target/release/kvcached"
    [[ -x $server ]] || (cd "$root" && cargo build --release --quiet -p kvcached) || exit 2
fi
for b in "$server" "$reference"; do
    [[ -x $b ]] || {
        echo "client-suites.sh: $b is not an executable" >&2
        exit 2
    }
done
server="$(readlink -f "$server")"
reference="$(readlink -f "$reference")"

cache="$root/target/client-suites"
mkdir -p "$cache"
work="$(mktemp -d /tmp/client-suites.XXXXXX)"
out=${keep:-$work/out}
mkdir -p "$out"
pids=()
cleanup() {
    stop_servers
    rm -rf "$work"
}
trap cleanup EXIT

as_root=()
[[ $(id -u) == 0 ]] && as_root=(-u root)

# ---- servers ------------------------------------------------------------------------

# The binary the current run tests (the reference or kvcached), and its SASL counterpart.
bin=""
sasl_bin=""

# serve ARGS...: start the server under test with ARGS and wait until it takes
# connections on each -p port, -l HOST:PORT and -s path given (-U alone: its TCP port).
serve() {
    "$bin" "${as_root[@]}" "$@" >>"$work/servers.log" 2>&1 &
    pids+=($!)
    wait_ready $! "$@"
}

wait_ready() {
    local pid=$1
    shift
    local want=() tcp="" udp="" host=127.0.0.1 a prev=""
    for a in "$@"; do
        case $prev in
        -p) tcp=$a ;;
        -U) udp=$a ;;
        -s) want+=("unix:$a") ;;
        -l) host=${a%%,*} ;;
        esac
        prev=$a
    done
    [[ -z $tcp && -n $udp ]] && tcp=$udp
    [[ -n $tcp && $tcp != 0 ]] && want+=("tcp:$host/$tcp")
    local w i
    for w in "${want[@]}"; do
        for ((i = 0; i < 200; i++)); do
            kill -0 "$pid" 2>/dev/null || {
                echo "server $* exited:" >&2
                tail -5 "$work/servers.log" >&2
                return 1
            }
            case $w in
            tcp:*) (exec 3<>"/dev/tcp/${w#tcp:}") 2>/dev/null && break ;;
            unix:*) [[ -S ${w#unix:} ]] && break ;;
            esac
            sleep 0.05
        done
        ((i < 200)) || {
            echo "server $* did not take connections ($w)" >&2
            return 1
        }
    done
}

stop_servers() {
    local p
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
    pids=()
}

# ports_free PORT... (a `u` prefix: UDP): whether nothing listens on them.
ports_free() {
    local p
    for p in "$@"; do
        if [[ $p == u* ]]; then
            [[ -z $(ss -lunH "sport = :${p#u}" 2>/dev/null) ]] || return 1
        else
            [[ -z $(ss -ltnH "sport = :$p" 2>/dev/null) ]] || return 1
        fi
    done
}

# ---- results ------------------------------------------------------------------------

# Each run leaves "$out/SUITE.WHICH.results": one line per test, `pass NAME`, `fail NAME`
# or `skip NAME`, and its raw output in "$out/SUITE.WHICH.log".

# pytest's -rA summary lines.
results_pytest() {
    sed -nE 's/^SKIPPED \[[0-9]+\] ([^ ]+).*/skip \1/p
        s/^(PASSED|FAILED|ERROR|XFAIL|XPASS) ([^ ]+).*/\1 \2/p' "$1" |
        sed -E 's/^PASSED/pass/; s/^(FAILED|ERROR|XPASS)/fail/; s/^XFAIL/skip/' | sort -u
}

# cargo test's `test NAME ... ok`, named by the test binary it ran in.
results_cargo() {
    awk '
        /^ *Running / { bin = $NF; sub(/.*\//, "", bin); sub(/-[0-9a-f]+\)?$/, "", bin) }
        /Doc-tests / { bin = "doc:" $2 }
        /^test .* \.\.\. (ok|FAILED|ignored)/ {
            name = $0; sub(/^test /, "", name); sub(/ \.\.\. .*/, "", name)
            if ($0 ~ /\.\.\. ok/) r = "pass"; else if ($0 ~ /FAILED/) r = "fail"; else r = "skip"
            print r, bin "::" name
        }
    ' "$1" | sort -u
}

# TAP from mocha's tap reporter.
results_tap() {
    sed -nE 's/^ok [0-9]+ (.*)/pass \1/p; s/^not ok [0-9]+ (.*)/fail \1/p' "$1" |
        sed -E 's/^pass (.*) # SKIP.*/skip \1/' | sort -u
}

# prove's per-file lines (`t/commands.t .. ok`, `... skipped: why`, `... Failed`).
results_prove() {
    sed -nE 's/^(t\/[^ ]+\.t) \.+ ?(.*)$/\1 \2/p' "$1" | awk '
        $2 == "ok" { print "pass", $1; next }
        $2 ~ /^skipped/ { print "skip", $1; next }
        { print "fail", $1 }' | sort -u
}

# ---- the suites ---------------------------------------------------------------------

py="$cache/venv/bin/python"
venv() {
    [[ -x $py ]] || python3 -m venv "$cache/venv" || return 1
    "$py" -m pip install -q --disable-pip-version-check "$@"
}

install_pymemcache() {
    venv pymemcache==4.0.0 pytest faker zstd
}

run_pymemcache() {
    local tests
    tests="$("$py" -c 'import os, pymemcache.test as t; print(os.path.dirname(t.__file__))')"
    serve -l 127.0.0.1 -p 11211 || return 1
    (cd "$work" && "$py" -m pytest -q -rA -p no:cacheprovider -W ignore "$tests" -m integration \
        --server 127.0.0.1 --port 11211)
}

install_bmemcached() {
    venv python-binary-memcached==0.33.0 pytest trustme uhashring || return 1
    local dl="$cache/bmemcached-dl"
    if [[ ! -d $cache/bmemcached-test ]]; then
        rm -rf "$dl" && mkdir -p "$dl" &&
            "$py" -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: \
                python-binary-memcached==0.33.0 -d "$dl" &&
            tar -xzf "$dl"/*.tar.gz -C "$dl" &&
            cp -r "$dl"/*/test "$cache/bmemcached-test" || return 1
    fi
    command -v saslpasswd2 >/dev/null || {
        echo "saslpasswd2 not found: apt-get install sasl2-bin" >&2
        return 1
    }
}

run_bmemcached() {
    local t="$work/bmemcached-test" sasl="$work/sasl" port=11219
    rm -rf "$t" && cp -r "$cache/bmemcached-test" "$t" || return 1
    # The servers its tests expect (upstream's test/conftest.py starts them): on 11211
    # (11212 and 11213 for the distributed client), 5000, ::1 (IPV6_PORT, here 11214), and
    # /tmp/memcached.sock; its TLS tests start `memcached` themselves, so a `memcached` on
    # PATH runs the server under test.
    serve -l 127.0.0.1,::1 -p 11211 || return 1
    for p in 11212 11213 5000; do serve -l 127.0.0.1,::1 -p $p || return 1; done
    serve -l ::1 -p 11214 || return 1
    rm -f /tmp/memcached.sock
    serve -s /tmp/memcached.sock || return 1
    mkdir -p "$work/bin" "$sasl"
    printf '#!/bin/sh\nexec %q %s "$@"\n' "$bin" "${as_root[*]}" >"$work/bin/memcached"
    chmod +x "$work/bin/memcached"
    # A SASL server: user `user`, password `secret`. memcached checks it through Cyrus
    # SASL (a sasldb), kvcached through MEMCACHED_SASL_PWDB.
    printf 'user:secret\n' >"$sasl/pwdb"
    printf 'mech_list: plain\nsasldb_path: %s/sasldb2\n' "$sasl" >"$sasl/memcached.conf"
    echo secret | saslpasswd2 -p -c -f "$sasl/sasldb2" -a memcached user || return 1
    SASL_CONF_PATH=$sasl MEMCACHED_SASL_PWDB=$sasl/pwdb \
        "$sasl_bin" "${as_root[@]}" -S -l 127.0.0.1 -p $port >>"$work/servers.log" 2>&1 &
    pids+=($!)
    wait_ready $! -p $port || return 1
    cat >"$t/conftest.py" <<EOF
# Written by kvcache's scripts/client-suites.sh: the servers were started by the script.
import os
import pytest

os.environ.setdefault("MEMCACHED_HOST", "localhost")
IPV6_PORT = 11214


@pytest.fixture(scope="session")
def memcached_ipv6():
    return IPV6_PORT


@pytest.fixture(scope="session")
def memcached_sasl():
    return ($port, "user", "secret")
EOF
    (cd "$t" && PATH="$work/bin:$PATH" PYTHONPATH="$t" "$py" -m pytest -q -rA \
        -p no:cacheprovider -W ignore .)
}

rust_src=""
install_rust-memcache() {
    command -v cargo >/dev/null || return 1
    local f="$cache/rust-fetch"
    mkdir -p "$f/src"
    printf '[workspace]\n\n[package]\nname = "fetch"\nversion = "0.0.0"\nedition = "2021"\n\n[dependencies]\nmemcache = "=0.21.0"\n' >"$f/Cargo.toml"
    : >"$f/src/lib.rs"
    (cd "$f" && cargo fetch -q) || return 1
    rust_src="$(cd "$f" && cargo metadata -q --format-version 1 |
        python3 -c 'import json,sys; print(next(p["manifest_path"] for p in json.load(sys.stdin)["packages"] if p["name"] == "memcache"))')"
    rust_src=${rust_src%/Cargo.toml}
    [[ -d $rust_src/tests ]]
}

run_rust-memcache() {
    local t="$work/rust-memcache" a
    rm -rf "$t" && cp -r "$rust_src" "$t" || return 1
    a="$t/tests/assets"
    # Its tests/setup_tests.sh, with the server under test.
    for p in 12345 12346 12347 12348 12349; do serve -l 127.0.0.1 -p $p || return 1; done
    serve -l 127.0.0.1 -p 12350 -Z -o "ssl_key=$a/localhost.key,ssl_chain_cert=$a/localhost.crt" || return 1
    serve -l 127.0.0.1 -p 12351 -Z -o "ssl_key=$a/localhost.key,ssl_chain_cert=$a/localhost.crt,ssl_verify_mode=2,ssl_ca_cert=$a/RUST_MEMCACHE_TEST_CERT.crt" || return 1
    serve -l 127.0.0.1 -U 22345 || return 1
    rm -f /tmp/memcached.sock /tmp/memcached2.sock
    serve -s /tmp/memcached.sock || return 1
    serve -s /tmp/memcached2.sock || return 1
    # One test at a time: its tests (the doc tests most) share keys on one server, and
    # some flush it, so run in parallel they fail at random against any server.
    (cd "$t" && cargo test --no-fail-fast --features tokio,serde_json --target-dir "$cache/rust-target" \
        -- --format pretty --test-threads 1 2>&1)
}

install_node-memcached() {
    command -v npm >/dev/null || return 1
    [[ -d $cache/node/node_modules/memcached/test ]] && return 0
    npm install --silent --no-audit --no-fund --prefix "$cache/node" \
        memcached@2.2.2 mocha@10 should@13
}

run_node-memcached() {
    local m="$cache/node/node_modules/memcached"
    for p in 11211 11212 11213; do serve -l 127.0.0.1 -p $p || return 1; done
    (cd "$m" && MEMCACHED__HOST=127.0.0.1 "$cache/node/node_modules/.bin/mocha" \
        --require should --exit --reporter tap --timeout 10000 test/*.test.js)
}

install_perl-fast() {
    [[ -n ${CMF_SRC:-} && -d ${CMF_SRC:-}/t ]] || {
        echo "CMF_SRC does not name a checkout of Cache-Memcached-Fast" >&2
        return 1
    }
    perl -MCache::Memcached::Fast -MTest2::V0 -e 1 2>/dev/null || {
        echo "Cache::Memcached::Fast or Test2::V0 not installed:" \
            "apt-get install libcache-memcached-fast-perl libtest2-suite-perl" >&2
        return 1
    }
}

run_perl-fast() {
    serve -l 127.0.0.1,::1 -p 11211 || return 1
    (cd "$CMF_SRC" && prove -I t t/*.t 2>&1)
}

declare -A ports=(
    [pymemcache]="11211"
    [bmemcached]="11211 11212 11213 11214 5000 5001 11219"
    [rust-memcache]="12345 12346 12347 12348 12349 12350 12351 22345 u22345"
    [node-memcached]="11211 11212 11213"
    [perl-fast]="11211"
)
declare -A parser=(
    [pymemcache]=results_pytest
    [bmemcached]=results_pytest
    [rust-memcache]=results_cargo
    [node-memcached]=results_tap
    [perl-fast]=results_prove
)

# ---- main ---------------------------------------------------------------------------

count() { grep -c "^$1 " "$2"; }
summary=()
differ=0
ran=0
started=$SECONDS
for s in "${suites[@]}"; do
    t0=$SECONDS
    # shellcheck disable=SC2086
    if ! ports_free ${ports[$s]}; then
        echo "skipped  $s: a port it needs is taken (${ports[$s]})"
        summary+=("$s skipped")
        continue
    fi
    if ! "install_$s" >"$out/$s.install.log" 2>&1; then
        echo "skipped  $s: could not install it (registry unreachable, or a tool missing):"
        tail -3 "$out/$s.install.log" | sed 's/^/           | /'
        summary+=("$s skipped")
        continue
    fi
    counts=()
    for which in reference kvcached; do
        if [[ $which == reference ]]; then
            bin=$reference sasl_bin=$sasl_reference
        else
            bin=$server sasl_bin=$server
        fi
        : >"$work/servers.log"
        "run_$s" >"$out/$s.$which.log" 2>&1
        stop_servers
        cat "$work/servers.log" >>"$out/$s.$which.log"
        "${parser[$s]}" "$out/$s.$which.log" >"$out/$s.$which.results"
        counts+=("$(count pass "$out/$s.$which.results") passed, $(count fail "$out/$s.$which.results") failed, $(count skip "$out/$s.$which.results") skipped")
    done
    ran=$((ran + 1))
    ref="$out/$s.reference.results"
    kv="$out/$s.kvcached.results"
    mapfile -t worse < <(comm -12 <(sed -n 's/^pass //p' "$ref" | sort) <(sed -n 's/^fail //p' "$kv" | sort))
    if ! grep -q '^pass ' "$ref"; then
        worse=("(none: no test passed on the reference, see $s.reference.log)")
    fi
    printf '%-8s %-15s %3ds  memcached: %s; kvcached: %s\n' \
        "$( ((${#worse[@]})) && echo FAILED || echo ok)" "$s" $((SECONDS - t0)) "${counts[0]}" "${counts[1]}"
    for w in "${worse[@]}"; do printf '           passes on memcached, fails on kvcached: %s\n' "$w"; done
    ((${#worse[@]})) && differ=$((differ + 1))
    summary+=("$s ${#worse[@]}")
done
echo "client-suites: $ran of ${#suites[@]} suites ran, $differ with tests that fail only on kvcached, in $((SECONDS - started))s (reference $reference)"
[[ -n $keep ]] && echo "client-suites: outputs in $keep"
((differ == 0))
