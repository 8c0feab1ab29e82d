"""A client watching at 2 refreshes per second: one `top` request every 0.5 s on dcpid's
control socket (what `dcpictl top` sends each refresh; its own symbolization is not the
daemon's cost). usage: top_watch.py SOCKET SECONDS; prints requests, rows of the last answer,
and the slowest answer."""
import json, socket, sys, time
sock, secs = sys.argv[1], float(sys.argv[2])
end = time.time() + secs
n, rows, slowest = 0, 0, 0.0
while time.time() < end:
    s = time.time()
    c = socket.socket(socket.AF_UNIX)
    c.connect(sock)
    c.sendall(b'{"cmd":"top"}\n')
    buf = b""
    while not buf.endswith(b"\n"):
        d = c.recv(1 << 20)
        if not d:
            break
        buf += d
    c.close()
    r = json.loads(buf)
    assert r["ok"], r
    rows = len(r["result"]["rows"])
    n += 1
    slowest = max(slowest, time.time() - s)
    time.sleep(max(0.0, 0.5 - (time.time() - s)))
print(n, rows, f"{slowest*1000:.0f}")
