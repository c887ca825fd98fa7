"""A TCP round-trip probe between two testnet namespaces, to check the emulated links themselves
(independently of the daemons' own ping measurements, which include their CPU time).

    ip netns exec NS_B python -m meshd.testnet.probe serve 10.77.2.2 7001 --idle 20
    ip netns exec NS_A python -m meshd.testnet.probe ping 10.77.2.2 7001 --count 20

``ping`` prints one JSON object: the round-trip samples in ms (small messages on one
connection with TCP_NODELAY, one at a time), their minimum and median.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import time

MSG = b"x" * 32


def serve(host: str, port: int, idle_s: float) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as srv:
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind((host, port))
        srv.listen(8)
        srv.settimeout(idle_s)
        print("ready", flush=True)
        while True:
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                return 0
            with conn:
                conn.settimeout(idle_s)
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                try:
                    while data := conn.recv(4096):
                        conn.sendall(data)
                except (TimeoutError, OSError):
                    pass


def _recv_exact(s: socket.socket, n: int) -> None:
    got = 0
    while got < n:
        chunk = s.recv(n - got)
        if not chunk:
            raise ConnectionError("closed")
        got += len(chunk)


def ping(host: str, port: int, count: int, gap_s: float, timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    while True:  # the server may not be listening yet
        try:
            s = socket.create_connection((host, port), timeout=timeout_s)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    samples = []
    with s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(count):
            t0 = time.perf_counter()
            s.sendall(MSG)
            _recv_exact(s, len(MSG))
            samples.append((time.perf_counter() - t0) * 1000.0)
            time.sleep(gap_s)
    print(json.dumps({"samples_ms": [round(x, 3) for x in samples], "min_ms": round(min(samples), 3),
                      "median_ms": round(statistics.median(samples), 3)}))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m meshd.testnet.probe")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve")
    s.add_argument("host")
    s.add_argument("port", type=int)
    s.add_argument("--idle", type=float, default=20.0)
    c = sub.add_parser("ping")
    c.add_argument("host")
    c.add_argument("port", type=int)
    c.add_argument("--count", type=int, default=20)
    c.add_argument("--gap", type=float, default=0.02)
    c.add_argument("--timeout", type=float, default=10.0)
    a = p.parse_args(sys.argv[1:] if argv is None else argv)
    if a.cmd == "serve":
        return serve(a.host, a.port, a.idle)
    return ping(a.host, a.port, a.count, a.gap, a.timeout)


if __name__ == "__main__":
    raise SystemExit(main())
