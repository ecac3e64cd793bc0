#!/usr/bin/env bash
# Installs what building kvcached and running its whole test suite need, on Debian.
# Idempotent: packages already present are not fetched again, so a second run is quick.
#
#   scripts/install-deps.sh           # everything the tests need
#   scripts/install-deps.sh --build   # only what `cargo build` needs (a C toolchain)
#
# Runs as root, or through sudo. The Rust toolchain (cargo, rustup) must already be
# installed; this adds its rustfmt and clippy components. Debian's memcached (the reference
# server of the differential tests) is installed but never left running as a service: it
# would hold port 11211, which is kvcached's.
set -euo pipefail

mode="${1:-all}"
case "$mode" in
all | --build) ;;
*)
    echo "usage: $0 [--build]" >&2
    exit 2
    ;;
esac

root="$(cd "$(dirname "$0")/.." && pwd)"
log="$(mktemp)"
trap 'rm -f "$log"' EXIT

die() {
    echo "install-deps.sh: $*" >&2
    exit 1
}

# Run a command quietly; on failure show its output and stop.
quiet() {
    if ! "$@" >"$log" 2>&1; then
        cat "$log" >&2
        die "failed: $*"
    fi
}

if [[ $(id -u) -eq 0 ]]; then
    as_root=()
elif command -v sudo >/dev/null 2>&1; then
    as_root=(sudo)
else
    die "run as root or install sudo"
fi

command -v cargo >/dev/null 2>&1 ||
    die "cargo not found: install the Rust toolchain (rustup, stable) first"

packages=(build-essential)
if [[ $mode == all ]]; then
    packages+=(
        memcached             # the differential tests' reference server
        libmemcached-tools    # memcslap, memcstat, ... (benchmarks, client checks)
        python3-pymemcache    # Python clients for the client-compatibility checks
        python3-pylibmc
        iproute2              # ss, and the network-namespace tests
        nftables              # packet loss in the replication chaos test
        procps                # kill, ps
        netcat-openbsd        # nc, as in the README
        help2man              # man pages, for scripts/package.sh
    )
fi

missing=()
for p in "${packages[@]}"; do
    if ! grep -q 'install ok installed' <<<"$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)"; then
        missing+=("$p")
    fi
done

if ((${#missing[@]} > 0)); then
    command -v apt-get >/dev/null 2>&1 || die "apt-get not found (need: ${missing[*]})"
    echo "install-deps.sh: installing ${missing[*]}"
    # Keep the memcached package from starting its service while it installs (a
    # policy-rc.d that says no), unless the machine already has its own policy.
    policy=/usr/sbin/policy-rc.d
    made_policy=false
    if [[ ! -e $policy ]]; then
        printf '#!/bin/sh\nexit 101\n' | "${as_root[@]}" tee "$policy" >/dev/null
        "${as_root[@]}" chmod 755 "$policy"
        made_policy=true
    fi
    export DEBIAN_FRONTEND=noninteractive
    status=0
    (
        quiet "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
        quiet "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive \
            apt-get install -y -q --no-install-recommends "${missing[@]}"
    ) || status=$?
    if $made_policy; then
        "${as_root[@]}" rm -f "$policy"
    fi
    ((status == 0)) || exit "$status"
fi

if [[ $mode == all ]]; then
    # However it got there, no memcached service stays enabled or running.
    if command -v systemctl >/dev/null 2>&1 && [[ -d /run/systemd/system ]]; then
        "${as_root[@]}" systemctl disable --now memcached >/dev/null 2>&1 || true
    elif command -v service >/dev/null 2>&1 && [[ -e /etc/init.d/memcached ]]; then
        "${as_root[@]}" service memcached stop >/dev/null 2>&1 || true
        if command -v update-rc.d >/dev/null 2>&1; then
            "${as_root[@]}" update-rc.d memcached disable >/dev/null 2>&1 || true
        fi
    fi
    [[ -x /usr/bin/memcached ]] || die "/usr/bin/memcached missing after install"

    # rustfmt and clippy for the active (stable) toolchain.
    if ! cargo fmt --version >/dev/null 2>&1 || ! cargo clippy --version >/dev/null 2>&1; then
        command -v rustup >/dev/null 2>&1 || die "cargo fmt/clippy missing and no rustup"
        echo "install-deps.sh: adding rustup components rustfmt clippy"
        quiet rustup component add rustfmt clippy
    fi

    # cargo-deb, for scripts/package.sh (built from crates.io; about two minutes). Pinned:
    # the check builds from the dev profile, which later releases may refuse.
    if ! grep -qx 'cargo-deb 3\.8\.0' <<<"$(cargo deb --version 2>/dev/null)"; then
        echo "install-deps.sh: installing cargo-deb 3.8.0"
        quiet cargo install cargo-deb --version 3.8.0 --locked
    fi

    # cargo-fuzz, for scripts/fuzz.sh (built from crates.io; about a minute).
    if [[ -d $root/fuzz ]] && ! cargo fuzz --version >/dev/null 2>&1; then
        echo "install-deps.sh: installing cargo-fuzz"
        quiet cargo install cargo-fuzz --locked
    fi
fi
