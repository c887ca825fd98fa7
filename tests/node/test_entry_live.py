"""The entry chain on a real daemon: every bad request is refused at once with the right code,
a reused request id is refused while the first runs, and nothing waits past the request
timeout (issue 13, defects 1-4)."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import aclosing
from typing import Any

import pytest
import trio

from meshd.control.client import submit_events
from meshd.core.messages import MessageType
from meshd.errors import RemoteError
from meshd.testnet.drive import ask, stream
from meshd.testnet.launcher import NodeSpec, down, up

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def sock(tmp_path_factory: pytest.TempPathFactory, shipped_model: None) -> Iterator[str]:
    d = tmp_path_factory.mktemp("entry")
    # 8 tokens/s: a 40-token request stays in flight for about 5 s
    spec = NodeSpec(name="e1", models=[{"path": "default", "max_decode_tokens_per_s": 8.0}],
                    extra={"routing": {"request_timeout_s": 20.0}})
    index = up(d, [spec], advert_interval_s=1.0)
    try:
        yield index["nodes"][0]["socket"]
    finally:
        down(d)


async def refusal(sock: str, fields: dict[str, Any]) -> tuple[str, str, float]:
    t0 = time.monotonic()
    with pytest.raises(RemoteError) as err:
        with trio.fail_after(30):
            await stream(sock, {"prompt": "In the beginning", **fields})
    return str(err.value.code), str(err.value), time.monotonic() - t0


@pytest.mark.parametrize(("fields", "code", "says"), [
    ({"seed": -1}, "malformed", "seed=-1"),
    ({"temperature": math.nan}, "malformed", "temperature=nan"),
    ({"top_k": -5}, "malformed", "top_k=-5"),
    ({"strategy": "fastest"}, "malformed", "strategy must be one of"),
    ({"max_tokens": 0}, "malformed", "max_tokens=0"),
    ({"max_tokens": -2}, "malformed", "max_tokens=-2"),
    ({"prompt": "   "}, "malformed", "prompt must be a non-empty string"),
    ({"rid": "r" * 500_000}, "malformed", "rid is 500000 characters"),
    ({"rid": ""}, "malformed", "rid must be a non-empty string"),
    # clamped to 4,096, still over tiny-en's 256-token context: refused before routing,
    # not a "kv cache full" from every node; the message quotes what was sent, and the clamp
    ({"max_tokens": 10**9}, "context_length_exceeded",
     "max_tokens is 1000000000 (clamped to 4096, the most one request may ask for)"),
    ({"prompt": "and the " * 400}, "context_length_exceeded", "context is 256"),
])
def test_bad_requests_are_refused_at_the_entry(sock: str, fields: dict[str, Any], code: str,
                                               says: str) -> None:
    got, message, took = trio.run(refusal, sock, fields)
    assert got == code
    assert says in message
    assert took < 5.0
    # and the daemon serves the next request
    ok = trio.run(stream, sock, {"prompt": "And God said", "max_tokens": 3,
                                 "temperature": 0.0})
    assert len(ok["ids"]) == 3


def entry_stats(sock: str) -> dict[str, Any]:
    r = ask(sock, MessageType.STATUS_REQ)
    assert r is not None, "the daemon did not answer STATUS"
    return dict(r["data"]["services"]["entry"])


def test_a_request_id_in_flight_is_refused_at_once(sock: str) -> None:
    before = entry_stats(sock)

    async def main() -> tuple[dict[str, Any], tuple[str, str, float]]:
        async with trio.open_nursery() as nursery:
            first: dict[str, Any] = {}
            started = trio.Event()

            async def long() -> None:
                fields = {"rid": "dup-1", "prompt": "In the beginning", "max_tokens": 40,
                          "temperature": 0.0}
                async with aclosing(submit_events(sock, fields, recv_timeout_s=60)) as events:
                    async for msg in events:
                        if msg["t"] == MessageType.TOKENS:
                            started.set()
                        elif msg["t"] == MessageType.DONE:
                            first.update(msg["stats"])

            nursery.start_soon(long)
            with trio.fail_after(30):
                await started.wait()
            second = await refusal(sock, {"rid": "dup-1"})
        return first, second

    first, (code, message, took) = trio.run(main)
    assert code == "duplicate_request" and "dup-1" in message
    assert took < 2.0  # at once, not after the first one ends
    assert first["tokens"] == 40 and first["request_id"] == "dup-1"  # the first is untouched
    # admit counted both and refused one; record counted the first's end and let its id go
    after = entry_stats(sock)
    moved = {k: after[k] - before[k] for k in ("submitted", "duplicate_ids", "answered", "failed",
                                               "cancelled", "timeouts")}
    assert moved == {"submitted": 2, "duplicate_ids": 1, "answered": 1, "failed": 0,
                     "cancelled": 0, "timeouts": 0}
    assert after["in_flight"] == 0 and after["client_in_flight"] == {}
    again = trio.run(stream, sock, {"rid": "dup-1", "prompt": "And God said", "max_tokens": 3,
                                    "temperature": 0.0})
    assert len(again["ids"]) == 3  # the id is free once its request is done


def test_no_client_waits_past_the_request_timeout(sock: str) -> None:
    # 200 tokens at 8 tokens/s would take 25 s; the node's request timeout is 20 s
    code, message, took = trio.run(refusal, sock, {"max_tokens": 200, "temperature": 0.0})
    assert code == "deadline" and "20 s" in message
    assert 19.0 < took < 24.0
