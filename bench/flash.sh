#!/usr/bin/env bash
# The flash tier against memcached's extstore (issue 43): bench/hitratio.sh's look-aside
# run (Zipf popularity, the same seeded request streams, alternating rounds) with each
# server given a flash file of the same size in DIR (`-o ext_path=DIR/NAME:SIZE`), so that
# a key space many times -m can be held. Reports each server's miss ratio and kvcached's
# over memcached's; the files are removed at the end. DIR should be on the flash device to
# measure (a tmpfs measures neither server's I/O).
#
# usage: bench/flash.sh -d DIR [-f SIZE] [-- HITRATIO OPTIONS]
#   -f SIZE: each flash file, with memcached's suffix (default 2g)
#   HITRATIO OPTIONS: bench/hitratio.sh's (-m, -k, -w, -n, -a, -r, -v BYTES, ...)
# e.g. bench/flash.sh -d /mnt/nvme/bench -- -m 64 -k 640000 -v 1024 -a 0.99
# The reference is $MEMCACHED (built with extstore: ../shared/ref/build.sh's is).
set -euo pipefail
cd "$(dirname "$0")/.."

dir=
size=2g
while getopts "d:f:" opt; do
    case $opt in
        d) dir=$OPTARG ;;
        f) size=$OPTARG ;;
        *) echo "usage: $0 -d DIR [-f SIZE] [-- HITRATIO OPTIONS]" >&2; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
[ -n "$dir" ] || { echo "usage: $0 -d DIR [-f SIZE] [-- HITRATIO OPTIONS]" >&2; exit 2; }
mkdir -p "$dir"
# (The help is taken whole first: with pipefail, `cmd | grep -q` fails when grep stops
# reading early and cmd dies of SIGPIPE.)
if [ -n "${MEMCACHED:-}" ] && ! grep -q ext_path <<<"$("$MEMCACHED" -h 2>&1 || true)"; then
    echo "flash.sh: $MEMCACHED was built without extstore" >&2
    exit 1
fi
trap 'rm -f "$dir/memcached-ext" "$dir/kvcached-ext"' EXIT
echo "flash files: $dir ($(df -h --output=source,fstype "$dir" | tail -1 | tr -s ' ')), $size each"
bench/hitratio.sh "$@" -M "-o ext_path=$dir/memcached-ext:$size" -- -U 0 -o "ext_path=$dir/kvcached-ext:$size"
