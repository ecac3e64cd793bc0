"""pymemcache over TLS, with Python's ssl module, against one server.

usage: tls.py PORT CA_FILE [CLIENT_CERT CLIENT_KEY]
Checks the server's certificate against CA_FILE (name "localhost"); presents the client
certificate when given. Prints "pymemcache tls: ok" and the negotiated version, or exits
non-zero on the first wrong answer.
"""
import ssl
import sys

from pymemcache.client.base import Client

port = int(sys.argv[1])
ctx = ssl.create_default_context(cafile=sys.argv[2])
ctx.check_hostname = True
if len(sys.argv) > 4:
    ctx.load_cert_chain(sys.argv[3], sys.argv[4])


def check(label, got, want):
    if got != want:
        print(f"{label}: got {got!r}, want {want!r}")
        sys.exit(1)


c = Client(("localhost", port), tls_context=ctx, connect_timeout=5, timeout=5)
check("set", c.set("k", b"hello", expire=0, noreply=False), True)
check("get", c.get("k"), b"hello")
big = b"x" * 200_000
check("set big", c.set("big", big, noreply=False), True)
check("get big", c.get("big"), big)
check("get_many", c.get_many(["k", "missing", "big"]), {"k": b"hello", "big": big})
check("incr", c.set("n", b"41", noreply=False) and c.incr("n", 1), 42)
check("delete", c.delete("k", noreply=False), True)
version = c.sock.version()
c.close()
print(f"pymemcache tls: ok ({version})")
