"""One bounded TCP flow, for measuring a link of scripts/netcluster.sh.

  flow.py recv PORT SECONDS   accepts one connection, reads until EOF or
                              SECONDS, prints {"bytes", "seconds", "mss"}: the
                              bytes read between 0.3 s after the first byte
                              (past slow start and tbf's first burst) and the
                              last read, over that time
  flow.py send HOST PORT SECONDS
                              writes to HOST:PORT for SECONDS, then closes

Every wait is bounded: the receiver gives up SECONDS + 5 s after it starts.
"""
import json
import socket
import sys
import time

WARMUP = 0.3


def recv(port, seconds):
    deadline = time.monotonic() + seconds + 5
    with socket.create_server(("", port)) as srv:
        srv.settimeout(seconds + 5)
        conn, _ = srv.accept()
    with conn:
        conn.settimeout(max(0.1, deadline - time.monotonic()))
        buf = bytearray(1 << 20)
        start = None
        counted = 0
        t_from = t_last = 0.0
        while time.monotonic() < deadline:
            n = conn.recv_into(buf)
            if n == 0:
                break
            now = time.monotonic()
            if start is None:
                start = now
            if now - start < WARMUP:
                t_from = now
                continue
            counted += n
            t_last = now
        # The sender's segment size, as the peer announced it to us.
        mss = conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG)
    print(json.dumps({"bytes": counted, "seconds": t_last - t_from, "mss": mss}))


def send(host, port, seconds):
    chunk = b"\0" * (1 << 16)
    for _ in range(50):  # the receiver may not listen yet: 5 s at most
        try:
            s = socket.create_connection((host, port), timeout=5)
            break
        except ConnectionRefusedError:
            time.sleep(0.1)
    else:
        sys.exit(f"flow: {host}:{port} refused for 5 s")
    with s:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            s.sendall(chunk)


if __name__ == "__main__":
    if sys.argv[1:2] == ["recv"] and len(sys.argv) == 4:
        recv(int(sys.argv[2]), float(sys.argv[3]))
    elif sys.argv[1:2] == ["send"] and len(sys.argv) == 5:
        send(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))
    else:
        sys.exit(__doc__)
