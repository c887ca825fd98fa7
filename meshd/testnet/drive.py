"""Drive running daemons from scripts and tests: run the CLI, wait on a condition, read a
node's peer table. Used by the live tests and the benchmarks; nothing here sleeps to wait for
readiness except between polls of a condition that has a deadline."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Mapping
from contextlib import aclosing
from typing import Any

import trio

from meshd.control.client import call, submit_events
from meshd.core.messages import MessageType
from meshd.errors import MeshdError
from meshd.testing.wait import wait_for


def cli(*args: str, check: bool = True, timeout: float = 60,
        env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``meshd ARGS`` in a new process with this interpreter; with ``check``, a non-zero
    exit raises AssertionError carrying its output."""
    proc = subprocess.run([sys.executable, "-m", "meshd", *args], capture_output=True, text=True,
                          timeout=timeout, env=None if env is None else dict(env))
    if check and proc.returncode != 0:
        raise AssertionError(f"meshd {' '.join(args)} failed ({proc.returncode}):\n"
                             f"{proc.stdout}\n{proc.stderr}")
    return proc


def ask(sock: str, mtype: MessageType, timeout_s: float = 5.0) -> dict[str, Any] | None:
    """One control request without fields (STATUS_REQ, PEERS_REQ...) in-process (a CLI process
    per poll would be slow); None if the daemon cannot answer right now."""

    async def go() -> Any:
        with trio.fail_after(timeout_s):
            return await call(sock, mtype, {})

    try:
        return dict(trio.run(go))
    except (MeshdError, trio.TooSlowError, OSError):
        return None


def peers_of(sock: str) -> list[dict[str, Any]]:
    """A node's peer table, asked in-process (a CLI process per poll would be slow); empty when
    the daemon cannot be reached right now."""
    try:
        reply = trio.run(call, sock, MessageType.PEERS_REQ, {})
    except MeshdError:
        return []
    return list(reply["peers"])


async def stream(sock: str, fields: dict[str, Any], on_first: Any = None) -> dict[str, Any]:
    """Submit ``fields`` through a control socket and collect the answer: token ``ids``, the
    nodes that ``served`` it (one per ROUTE frame), the DONE frame's ``stats``, when it came
    (``done_at``, time.monotonic) and when the SUBMIT frame left on the open connection
    (``sent_at``); ``on_first(served_by)`` is called at the first tokens. Without ``rid`` in
    ``fields`` the request gets a new id, as `meshd submit` gives it."""
    fields = {"rid": uuid.uuid4().hex[:16], **fields}
    ids: list[int] = []
    routes: list[str] = []
    sent: list[float] = []
    async with aclosing(submit_events(sock, fields, recv_timeout_s=60,
                                      on_sent=lambda: sent.append(time.monotonic()))) as events:
        async for msg in events:
            if msg["t"] == MessageType.ROUTE:
                routes.append(msg["served_by"])
            elif msg["t"] == MessageType.TOKENS:
                if not ids and on_first is not None:
                    on_first(routes[-1])
                ids.extend(msg["ids"])
            elif msg["t"] == MessageType.DONE:
                return {"ids": ids, "served": routes, "stats": msg["stats"],
                        "done_at": time.monotonic(), "sent_at": sent[0]}
    raise AssertionError("the request ended without a DONE frame")


__all__ = ["cli", "peers_of", "stream", "wait_for"]
