#!/usr/bin/env bash
# Replication under faults for as long as asked (issue 11): runs the chaos test of
# tests/replication_netns.rs (chaos_under_load_every_replica_ends_equal) for DURATION seconds
# and prints what it did, the full and partial resyncs, and whether every replica's digest
# ended equal to the master's.
#
# A master under a write, delete and expiry load (kvblast's, and the test's own, whose
# replies it checks; after the failover both follow the promoted replica); replica1 pulling from it over a link with
# 20-100 ms of delay each way (netem, or a user-space relay over TUN devices where the
# kernel has no netem) and 1-5% loss each way (an nftables `numgen random` rule;
# scripts/install-deps.sh installs nftables); replica2 chained behind replica1. The link is cut for
# 600 ms every 2 s; at 30% of the run replica2 is SIGKILLed and restarted; at 60% the master
# is SIGKILLed, replica1 promoted, and the old master restarted as its replica.
#
#   bench/chaos.sh [-d SECONDS] [-t]      (default 120; needs root and iproute2)
#
# -t: times to live of 1-10 s on every expiring write, link cuts of 3 s every 5 s, and
# masters that keep at most 1 MiB of expired or dead segments for a lagging replica
# (--repl-backlog 1): a cut-off replica falls behind past what its master keeps while whole
# segments expire, and must still continue without a full sync (the run fails if any
# replica resynchronizes fully after its first sync).
#
# The test suite runs the same test for 30 s.
set -euo pipefail
cd "$(dirname "$0")/.."
duration=120
ttl=0
while getopts "d:t" opt; do
    case $opt in
        d) duration=$OPTARG ;;
        t) ttl=1 ;;
        *) echo "usage: $0 [-d SECONDS] [-t]" >&2; exit 2 ;;
    esac
done
echo "machine: $(nproc) cores; $(uname -r); $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
# The test runs kvblast from next to the kvcached binary it tests.
cargo build --release -q -p kvblast
set +e
KVCACHED_CHAOS_SECS=$duration KVCACHED_CHAOS_TTL=$ttl cargo test --release -q --test replication_netns \
    chaos_under_load_every_replica_ends_equal -- --nocapture 2>&1 |
    grep -E '^(chaos|SKIP|test |thread )|panicked|digest'
status=${PIPESTATUS[0]}
set -e
if [ "$status" = 0 ]; then
    echo "chaos.sh: every replica's digest equal to the master's"
else
    echo "chaos.sh: FAILED (exit $status)"
fi
exit "$status"
