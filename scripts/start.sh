#!/usr/bin/env bash
# Builds kvcached (release) and runs it in the foreground:
#
#   scripts/start.sh                 # 127.0.0.1:11211, 64 MB of items
#   scripts/start.sh -m 1024 -t 4    # any memcached/kvcached flags are passed through
#
# Defaults (each only when the arguments don't set it): -l 127.0.0.1, -p 11211, -m 64, and
# when run as root -u nobody (kvcached, like memcached, refuses to run as root without -u).
# Needs the Rust toolchain; installs a C toolchain for the build if missing.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"

"$root/scripts/install-deps.sh" --build
cargo build --release --quiet --bin kvcached

# Is any of these options among the arguments (`-p 1`, `-p1`, `--port 1`, `--port=1`)?
given() {
    local arg opt
    for arg in "${args[@]}"; do
        for opt in "$@"; do
            if [[ $opt == --* ]]; then
                [[ $arg == "$opt" || $arg == "$opt="* ]] && return 0
            else
                [[ $arg == "$opt"* ]] && return 0
            fi
        done
    done
    return 1
}

args=("$@")
defaults=()
if ! given -s --unix-socket; then
    given -l --listen || defaults+=(-l 127.0.0.1)
    given -p --port || defaults+=(-p 11211)
fi
given -m --memory-limit || defaults+=(-m 64)
if [[ $(id -u) -eq 0 ]] && ! given -u --user; then
    defaults+=(-u nobody)
fi

exec "${CARGO_TARGET_DIR:-$root/target}/release/kvcached" "${defaults[@]}" "$@"
