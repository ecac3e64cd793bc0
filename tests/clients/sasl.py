"""pylibmc (libmemcached) with SASL: binary protocol, username and password.

usage: sasl.py PORT
The server must accept alice/secret and refuse alice/wrong. Prints "pylibmc sasl: ok" and
exits 0, or prints the first wrong answer and exits 1.
"""
import sys

import pylibmc

addr = f"127.0.0.1:{sys.argv[1]}"


def check(label, got, want):
    if got != want:
        print(f"{label}: got {got!r}, want {want!r}")
        sys.exit(1)


c = pylibmc.Client([addr], binary=True, username="alice", password="secret")
check("set", c.set("k", "hello"), True)
check("get", c.get("k"), "hello")
check("incr", (c.set("n", 1), c.incr("n", 41))[1], 42)
check("delete", c.delete("k"), True)
check("get deleted", c.get("k"), None)
big = "x" * 100_000
check("set big", c.set("big", big), True)
check("get big", c.get("big"), big)

bad = pylibmc.Client([addr], binary=True, username="alice", password="wrong")
try:
    bad.set("k", "v")
    print("wrong password: set succeeded")
    sys.exit(1)
except pylibmc.Error:
    pass
print("pylibmc sasl: ok")
