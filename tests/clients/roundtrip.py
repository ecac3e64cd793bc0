"""Round trips through real memcached client libraries against one server.

usage: roundtrip.py PORT
Uses pymemcache (text protocol) and pylibmc (libmemcached: text and binary protocols), the
Debian packages scripts/install-deps.sh installs. Prints one line per library and exits
non-zero on the first wrong answer.
"""
import sys

import pylibmc
from pymemcache.client.base import Client as PyClient

port = int(sys.argv[1])
addr = f"127.0.0.1:{port}"


def check(label, got, want):
    if got != want:
        print(f"{label}: got {got!r}, want {want!r}")
        sys.exit(1)


def pymemcache_round_trip():
    c = PyClient(("127.0.0.1", port), connect_timeout=5, timeout=5)
    c.flush_all()
    check("py set", c.set("k", b"hello", expire=0), True)
    check("py get", c.get("k"), b"hello")
    check("py add existing", c.add("k", b"x", noreply=False), False)
    check("py append", c.append("k", b"!", noreply=False), True)
    check("py get appended", c.get("k"), b"hello!")
    value, cas = c.gets("k")
    check("py gets", value, b"hello!")
    check("py cas ok", c.cas("k", b"v2", cas, noreply=False), True)
    check("py cas stale", c.cas("k", b"v3", cas, noreply=False), False)
    check("py get_many", c.get_many(["k", "missing"]), {"k": b"v2"})
    c.set("n", b"10")
    check("py incr", c.incr("n", 5), 15)
    check("py decr", c.decr("n", 20), 0)
    check("py delete", c.delete("k", noreply=False), True)
    check("py get deleted", c.get("k"), None)
    check("py touch missing", c.touch("k", 10, noreply=False), False)
    check("py stats", b"curr_items" in c.stats(), True)
    check("py version", bool(c.version()), True)
    print("pymemcache: ok")


def pylibmc_round_trip(binary):
    name = "pylibmc binary" if binary else "pylibmc text"
    c = pylibmc.Client([addr], binary=binary)
    c.flush_all()
    check(f"{name} set", c.set("k", "hello"), True)
    check(f"{name} get", c.get("k"), "hello")
    check(f"{name} add existing", c.add("k", "x"), False)
    check(f"{name} replace", c.replace("k", "world"), True)
    check(f"{name} get_multi", c.get_multi(["k", "nope"]), {"k": "world"})
    check(f"{name} set_multi", c.set_multi({"a": 1, "b": 2}), [])
    check(f"{name} get ints", (c.get("a"), c.get("b")), (1, 2))
    c.set("n", 10)
    check(f"{name} incr", c.incr("n", 5), 15)
    check(f"{name} decr", c.decr("n", 100), 0)
    check(f"{name} delete", c.delete("k"), True)
    check(f"{name} get deleted", c.get("k"), None)
    big = "x" * 500_000
    check(f"{name} set big", c.set("big", big), True)
    check(f"{name} get big", c.get("big"), big)
    print(f"{name}: ok")


pymemcache_round_trip()
pylibmc_round_trip(binary=False)
pylibmc_round_trip(binary=True)
