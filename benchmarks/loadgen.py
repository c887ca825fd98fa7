"""Shared by bench_soak.py and bench_churn.py: a mesh of capped daemons, open-loop Poisson
arrivals, one tracked request through a control socket, and per-process RSS / file descriptors.

Node speeds are set with ``max_decode_tokens_per_s`` (as the testnet scenarios do), so the mesh's
capacity is a property of the config, not of how busy the shared machine is:
``capacity_rps = nodes x max_concurrency / ((max_tokens - 1) / cap)``.
"""

from __future__ import annotations

import os
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from meshd.control.client import call, connect, raise_if_error  # noqa: E402
from meshd.core.messages import MessageType  # noqa: E402
from meshd.errors import MeshdError  # noqa: E402
from meshd.testnet.launcher import NodeSpec  # noqa: E402

PROMPTS = [
    "In the beginning", "And the LORD said unto Moses", "Blessed are the meek",
    "The king of Babylon", "And it came to pass", "Now the serpent was", "Hear, O Israel",
    "For God so loved the world", "The heavens declare", "And Jesus answered and said",
]  # fmt: skip
REQUEST_TIMEOUT_S = 120.0
SLOTS = 2  # max_concurrency of every node


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def capped_specs(n: int, cap: float, prefix: str = "n") -> list[NodeSpec]:
    return [NodeSpec(name=f"{prefix}{i + 1}",
                     models=[{"path": "default", "max_concurrency": SLOTS,
                              "max_decode_tokens_per_s": cap}]) for i in range(n)]


def capacity_rps(n: int, cap: float, max_tokens: int) -> float:
    return n * SLOTS / ((max_tokens - 1) / cap)


def arrivals(rate_rps: float, count: int | None, duration_s: float | None,
             entries: list[str], seed: int) -> list[tuple[float, str]]:
    """Poisson arrival times with a uniformly chosen entry node, until ``count`` arrivals or
    ``duration_s`` seconds."""
    rng = random.Random(seed)
    out: list[tuple[float, str]] = []
    t = 0.0
    while True:
        t += rng.expovariate(rate_rps)
        if (duration_s is not None and t > duration_s) or (count is not None and len(out) >= count):
            return out
        out.append((t, rng.choice(entries)))


@dataclass
class Attempt:
    entry: str
    ttft_ms: float | None = None
    e2e_ms: float | None = None
    served: list[str] = field(default_factory=list)  # one per ROUTE frame: >1 = failed over
    retries: int = 0  # the entry node's own retries (DONE stats)
    tokens: int = 0
    error: str = ""
    stage: str = ""  # where it failed: connect, mid-request, answer


async def attempt(sock: str, fields: dict[str, Any], entry: str) -> Attempt:
    a = Attempt(entry)
    t0 = trio.current_time()
    a.stage = "connect"
    try:
        with trio.fail_after(REQUEST_TIMEOUT_S):
            async with connect(sock) as framed:
                a.stage = "mid-request"
                await framed.send(MessageType.SUBMIT, fields)
                while True:
                    msg = await framed.recv()
                    if msg is None:
                        a.error = "the daemon closed the connection mid-request"
                        return a
                    if msg["t"] == MessageType.ERROR:
                        a.stage = "answer"
                    raise_if_error(msg)
                    if msg["t"] == MessageType.ROUTE:
                        a.served.append(str(msg["served_by"]))
                    elif msg["t"] == MessageType.TOKENS and a.ttft_ms is None:
                        a.ttft_ms = (trio.current_time() - t0) * 1000.0
                    elif msg["t"] == MessageType.DONE:
                        st = msg.get("stats") or {}
                        a.e2e_ms = (trio.current_time() - t0) * 1000.0
                        a.tokens = int(st.get("tokens") or 0)
                        a.retries = int(st.get("retries") or 0)
                        a.stage = ""
                        return a
    except trio.TooSlowError:
        a.error = f"no answer within {REQUEST_TIMEOUT_S:g} s"
    except (MeshdError, OSError) as e:
        a.error = f"{type(e).__name__}: {str(e)[:160]}"
    return a


def request_fields(tag: str, i: int, max_tokens: int) -> dict[str, Any]:
    return {"rid": f"{tag}-{i:05d}", "prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": max_tokens,
            "temperature": 0.0, "seed": i, "client": "bench"}


def rss_kb(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def open_fds(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def unix_socket_paths() -> dict[str, tuple[str, str]]:
    """Every unix socket of this network namespace: inode -> (flags, path). An accepted
    connection shows the path of the socket it was accepted on; a listening one has flag
    ``00010000`` (__SO_ACCEPTCON)."""
    out: dict[str, tuple[str, str]] = {}
    try:
        with open("/proc/net/unix") as f:
            next(f)
            for line in f:
                x = line.split()
                if len(x) >= 7:
                    out[x[6]] = (x[3], x[7] if len(x) > 7 else "")
    except OSError:
        pass
    return out


def fd_census(pid: int, control_socket: str, unix: dict[str, tuple[str, str]]) -> tuple[int, int] | None:
    """(open file descriptors, of which control-socket connections accepted from clients) of
    daemon ``pid``; ``unix`` from ``unix_socket_paths()``. Each accepted connection is one
    client's request in flight at this instant (closed when it is answered), so their number
    follows the offered load; the rest are what the daemon itself holds."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return None
    accepted = 0
    for fd in fds:
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            flags, path = unix.get(link[8:-1], ("", ""))
            if path == control_socket and flags != "00010000":
                accepted += 1
    return len(fds), accepted


def percentile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    if not s:
        return 0.0
    return s[max(0, min(len(s) - 1, int(round(q / 100.0 * (len(s) - 1)))))]


def machine_note() -> str:
    load = os.getloadavg()
    return (f"{os.cpu_count()} CPUs, load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} "
            "(1/5/15 min) at the end")


async def ask(sock: str, mtype: MessageType, timeout_s: float = 5.0) -> dict[str, Any] | None:
    """One control-socket request without fields (STATUS_REQ, PEERS_REQ...); None if the daemon
    does not answer in time or answers with an error."""
    try:
        with trio.fail_after(timeout_s):
            return dict(await call(sock, mtype, {}))
    except (MeshdError, trio.TooSlowError, OSError):
        return None


async def ask_all(socks: dict[str, str], mtype: MessageType,
                  timeout_s: float = 5.0) -> dict[str, dict[str, Any] | None]:
    """``ask`` every daemon at once: name -> its answer (or None)."""
    out: dict[str, dict[str, Any] | None] = {}

    async def one(name: str, sock: str) -> None:
        out[name] = await ask(sock, mtype, timeout_s)

    async with trio.open_nursery() as nursery:
        for name, sock in socks.items():
            nursery.start_soon(one, name, sock)
    return out
