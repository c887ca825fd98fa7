"""The user-space link emulator: a process in the testnet's router namespace that reads every
packet between two nodes from a TUN device and writes it back after its emulated delay.

Run by the launcher as ``ip netns exec ROUTER python -m meshd.testnet.forwarder CONFIG.json``.
The router's policy routing sends every packet that arrives on a node's veth to the TUN device
(``ip rule add iif VETH lookup TABLE``, TABLE's default route is the TUN); a packet written back
into the TUN is routed by the main table's connected routes to the destination node's veth. The
schedule itself (delay, jitter, loss, order) is the pure ``meshd.testnet.netem.Schedule``.

The daemons know nothing of this: they see ordinary TCP between distinct addresses.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import select
import signal
import struct
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

from meshd.testnet.netem import OneWay, Schedule, ip4, percentile

log = logging.getLogger(__name__)

TUNSETIFF = 0x400454CA
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000
MAX_PACKET = 65536
READ_BATCH = 256
STATS_EVERY_S = 2.0


def open_tun(name: str) -> int:
    """Attach to the (already created, persistent) TUN device ``name``; non-blocking fd."""
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    try:
        fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
    except OSError:
        os.close(fd)
        raise
    return fd


def raise_priority(rt_priority: int) -> str:
    """Emulated delays must not wait for the daemons' CPU: run the forwarder (which sleeps in
    epoll almost all the time) at a real-time priority, or failing that at nice -10."""
    if rt_priority > 0:
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(rt_priority))
            return f"SCHED_FIFO {rt_priority}"
        except (OSError, AttributeError):
            pass
    try:
        os.nice(-10)
        return "nice -10"
    except OSError:
        return "normal"


def load_links(cfg: dict[str, Any]) -> dict[tuple[bytes, bytes], OneWay]:
    return {
        (ip4(src), ip4(dst)): OneWay(float(d), float(j), float(loss))
        for src, dst, d, j, loss in cfg["links"]
    }


class Forwarder:
    def __init__(self, fd: int, schedule: Schedule, stats_path: Path | None) -> None:
        self.fd = fd
        self.schedule = schedule
        self.stats_path = stats_path
        self.late_ms: deque[float] = deque(maxlen=20000)  # how late packets left vs. their due time
        self.write_errors = 0
        self.running = True
        self.started = time.monotonic()

    def stop(self, *_: Any) -> None:
        self.running = False

    def run(self) -> None:
        ep = select.epoll()
        ep.register(self.fd, select.EPOLLIN)
        next_stats = time.monotonic() + STATS_EVERY_S
        while self.running:
            nd = self.schedule.next_due()
            now = time.monotonic()
            timeout = 1.0 if nd is None else max(0.0, nd - now)
            if ep.poll(min(timeout, 1.0)):
                self._read(time.monotonic())
            self._write(time.monotonic())
            if time.monotonic() >= next_stats:
                self.write_stats()
                next_stats = time.monotonic() + STATS_EVERY_S
        self.write_stats()

    def _read(self, now: float) -> None:
        for _ in range(READ_BATCH):
            try:
                packet = os.read(self.fd, MAX_PACKET)
            except BlockingIOError:
                return
            except InterruptedError:
                continue
            self.schedule.offer(packet, now)

    def _write(self, now: float) -> None:
        for due, packet in self.schedule.due(now):
            self.late_ms.append((now - due) * 1000.0)
            try:
                os.write(self.fd, packet)
            except OSError:
                self.write_errors += 1

    def statistics(self) -> dict[str, Any]:
        late = list(self.late_ms)
        return {
            **self.schedule.stats.as_dict(),
            "waiting": len(self.schedule),
            "write_errors": self.write_errors,
            "late_ms_p50": round(percentile(late, 50), 3),
            "late_ms_p99": round(percentile(late, 99), 3),
            "late_ms_max": round(max(late, default=0.0), 3),
            "uptime_s": round(time.monotonic() - self.started, 1),
        }

    def write_stats(self) -> None:
        if self.stats_path is None:
            return
        tmp = self.stats_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.statistics()))
        tmp.replace(self.stats_path)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m meshd.testnet.forwarder CONFIG.json", file=sys.stderr)
        return 2
    cfg = json.loads(Path(args[0]).read_text())
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    priority = raise_priority(int(cfg.get("rt_priority", 10)))
    fd = open_tun(cfg["tun"])
    schedule = Schedule(load_links(cfg), seed=int(cfg.get("seed", 1)), reorder=bool(cfg.get("reorder", False)))
    fwd = Forwarder(fd, schedule, Path(cfg["stats"]) if cfg.get("stats") else None)
    signal.signal(signal.SIGTERM, fwd.stop)
    signal.signal(signal.SIGINT, fwd.stop)
    log.info("forwarder started tun=%s links=%d pid=%d priority=%s", cfg["tun"], len(schedule.links),
             os.getpid(), priority)
    if cfg.get("ready"):
        Path(cfg["ready"]).write_text(str(os.getpid()))
    fwd.run()
    log.info("forwarder stopped %s", fwd.statistics())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
