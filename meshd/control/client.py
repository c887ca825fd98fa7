"""Client side of the control socket, used by ``meshd submit/status/peers/explain``."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from meshd.core.messages import CONTROL_REPLY_TYPES, CONTROL_VERSION, MessageType
from meshd.core.wire import MAX_CONTROL_FRAME, Message, frame
from meshd.errors import LocalError, PeerGoneError, RemoteError
from meshd.net.framed import FramedStream, TrioStreamAdapter
from meshd.paths import socket_candidates

CONNECT_TIMEOUT_S = 5.0


class NoDaemonError(LocalError):
    pass


def find_socket(explicit: str | None) -> Path:
    tried = socket_candidates(explicit)
    for p in tried:
        if p.exists():
            return p
    if explicit:
        raise NoDaemonError(f"no daemon socket at {explicit}")
    names = ", ".join(str(p) for p in tried)
    raise NoDaemonError(
        f"no meshd daemon found (tried {names}); start one with `meshd run --config FILE` "
        "or a local mesh with `meshd testnet up`, or pass --socket PATH"
    )


@asynccontextmanager
async def connect(explicit: str | None, request: tuple[MessageType, dict[str, Any]] | None = None,
                  *, on_sent: Callable[[], None] | None = None) -> AsyncIterator[FramedStream]:
    """An open control connection, its HELLO answered. ``request`` (type, fields) leaves in the
    same write as HELLO, not a round trip after it: the daemon reads its frames in order and
    answers HELLO first, and one that refuses the HELLO (another protocol version) never reads
    the request. ``on_sent`` is called just before that write."""
    path = find_socket(explicit)
    try:
        with trio.fail_after(CONNECT_TIMEOUT_S):
            stream = await trio.open_unix_socket(str(path))
    except (OSError, trio.TooSlowError) as e:
        raise NoDaemonError(f"cannot reach the daemon at {path}: {e}") from None
    framed = FramedStream(TrioStreamAdapter(stream), MAX_CONTROL_FRAME, CONTROL_REPLY_TYPES)
    try:
        with trio.fail_after(CONNECT_TIMEOUT_S):
            data = frame(MessageType.HELLO, {"v": CONTROL_VERSION, "client": "meshd-cli"})
            if request is not None:
                data += frame(*request)
            if on_sent is not None:
                on_sent()
            await framed.send_raw(data)
            hello = await framed.recv()
        if hello is None:
            raise NoDaemonError(f"the daemon at {path} closed the connection")
        raise_if_error(hello)
        yield framed
    finally:
        await framed.close()


def raise_if_error(msg: Message) -> None:
    if msg["t"] == MessageType.ERROR:
        raise RemoteError(msg["message"], code=msg["code"])


async def call(explicit: str | None, mtype: MessageType, fields: dict[str, Any]) -> Message:
    """One request, one reply."""
    async with connect(explicit, (mtype, fields)) as framed:
        reply = await framed.recv()
    if reply is None:
        raise PeerGoneError("the daemon closed the connection without answering")
    raise_if_error(reply)
    return reply


async def submit_events(
    explicit: str | None, fields: dict[str, Any], *, recv_timeout_s: float | None = None,
    on_sent: Callable[[], None] | None = None,
) -> AsyncGenerator[Message, None]:
    """Submit a request and yield its ROUTE and TOKENS frames, then its DONE frame (last).

    An ERROR frame raises ``RemoteError``; the daemon closing the socket mid-request raises
    ``PeerGoneError``; ``recv_timeout_s`` bounds the wait for each frame. ``on_sent`` is called
    once the connection is open and the SUBMIT frame is about to leave (benchmarks time from it).
    """
    async with connect(explicit, (MessageType.SUBMIT, fields), on_sent=on_sent) as framed:
        while True:
            with trio.fail_after(recv_timeout_s if recv_timeout_s is not None else float("inf")):
                msg = await framed.recv()
            if msg is None:
                raise PeerGoneError("the daemon closed the connection mid-request")
            raise_if_error(msg)
            yield msg
            if msg["t"] == MessageType.DONE:
                return
