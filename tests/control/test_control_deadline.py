"""The control socket does not wait forever on a client that stops half way (issue 13, defect 5).

A real ``ControlServer`` on a unix socket with a fake handler; each test waits for the server to
close the connection, with a deadline well above the server's own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio

from meshd.control.server import ControlServer
from meshd.core.messages import CONTROL_REPLY_TYPES, CONTROL_VERSION, MessageType
from meshd.core.wire import MAX_CONTROL_FRAME, Message, frame
from meshd.net.framed import FramedStream, TrioStreamAdapter

SERVER_DEADLINE_S = 0.5
TEST_DEADLINE_S = 10.0


class Handler:
    node_name = "n1"
    peer_id = "12D3KooWtest"

    def __init__(self) -> None:
        self.handled: list[Message] = []

    async def handle_control(self, msg: Message, out: FramedStream) -> None:
        self.handled.append(msg)
        await out.send(MessageType.STATUS, {"data": {"ok": True}})


async def _with_server(tmp_path: Path, body: Any) -> Handler:
    handler = Handler()
    server = ControlServer(tmp_path / "meshd.sock", handler, hello_timeout_s=SERVER_DEADLINE_S,
                           request_timeout_s=SERVER_DEADLINE_S)
    async with trio.open_nursery() as nursery:
        await nursery.start(server.run)
        stream = await trio.open_unix_socket(str(tmp_path / "meshd.sock"))
        with trio.fail_after(TEST_DEADLINE_S):
            await body(stream)
        nursery.cancel_scope.cancel()
    handler.stats = server.stats  # type: ignore[attr-defined]
    return handler


async def _hello(stream: trio.SocketStream) -> None:
    await stream.send_all(frame(MessageType.HELLO, {"v": CONTROL_VERSION}))
    framed = FramedStream(TrioStreamAdapter(stream), MAX_CONTROL_FRAME, CONTROL_REPLY_TYPES)
    reply = await framed.recv()
    assert reply is not None and reply["t"] == MessageType.HELLO_OK


async def _read_to_eof(stream: trio.SocketStream) -> bytes:
    data = b""
    while chunk := await stream.receive_some(4096):
        data += chunk
    return data


def test_partial_request_frame_after_hello_is_dropped(tmp_path: Path) -> None:
    async def body(stream: trio.SocketStream) -> None:
        await _hello(stream)
        whole = frame(MessageType.STATUS_REQ, {})
        await stream.send_all(whole[:3])  # part of the length prefix, then nothing
        assert await _read_to_eof(stream) == b""  # the server closes the connection

    handler = trio.run(_with_server, tmp_path, body)
    assert handler.handled == []
    assert handler.stats["timeouts"] == 1  # type: ignore[attr-defined]


def test_silent_client_after_hello_is_dropped(tmp_path: Path) -> None:
    async def body(stream: trio.SocketStream) -> None:
        await _hello(stream)
        assert await _read_to_eof(stream) == b""

    trio.run(_with_server, tmp_path, body)


def test_partial_hello_is_dropped(tmp_path: Path) -> None:
    async def body(stream: trio.SocketStream) -> None:
        await stream.send_all(frame(MessageType.HELLO, {"v": CONTROL_VERSION})[:6])
        assert await _read_to_eof(stream) == b""

    trio.run(_with_server, tmp_path, body)


def test_a_prompt_client_is_answered(tmp_path: Path) -> None:
    async def body(stream: trio.SocketStream) -> None:
        await _hello(stream)
        await stream.send_all(frame(MessageType.STATUS_REQ, {}))
        framed = FramedStream(TrioStreamAdapter(stream), MAX_CONTROL_FRAME, CONTROL_REPLY_TYPES)
        reply = await framed.recv()
        assert reply is not None and reply["t"] == MessageType.STATUS

    handler = trio.run(_with_server, tmp_path, body)
    assert [m["t"] for m in handler.handled] == [MessageType.STATUS_REQ]
