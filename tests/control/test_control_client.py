"""The control client sends its request in the same write as HELLO (no round trip between
them), and still answers a refused HELLO with the daemon's error."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from meshd.control.client import call
from meshd.control.server import ControlServer
from meshd.core.messages import CONTROL_TYPES, CONTROL_VERSION, MessageType
from meshd.core.wire import MAX_CONTROL_FRAME, FrameDecoder, frame
from meshd.errors import ErrorCode, RemoteError
from meshd.net.framed import FramedStream

DEADLINE_S = 10.0


async def _raw_daemon(path: Path, reply_to_hello: bytes, seen: list[list[int]],
                      task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Reads what the client sent *before* anything is answered (the frames seen then), then
    answers HELLO with ``reply_to_hello`` and the request, if it came, with STATUS."""
    sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
    await sock.bind(str(path))
    sock.listen(1)
    task_status.started()
    conn, _ = await sock.accept()
    stream = trio.SocketStream(conn)
    decoder = FrameDecoder(MAX_CONTROL_FRAME, CONTROL_TYPES)
    got: list[int] = []
    while len(got) < 2:  # HELLO and the request, with no answer sent yet
        data = await stream.receive_some(1 << 16)
        if not data:
            break
        decoder.feed(data)
        got += [int(m["t"]) for m in decoder.messages()]
    seen.append(got)
    await stream.send_all(reply_to_hello)
    if got[-1:] == [int(MessageType.STATUS_REQ)]:
        await stream.send_all(frame(MessageType.STATUS, {"data": {"ok": True}}))
    await stream.aclose()


def test_the_request_leaves_with_hello_not_a_round_trip_after_it(tmp_path: Path) -> None:
    seen: list[list[int]] = []
    ok = frame(MessageType.HELLO_OK, {"v": CONTROL_VERSION, "node": "n1", "peer_id": "p"})

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(_raw_daemon, tmp_path / "d.sock", ok, seen)
            with trio.fail_after(DEADLINE_S):
                reply = await call(str(tmp_path / "d.sock"), MessageType.STATUS_REQ, {})
            assert reply["t"] == MessageType.STATUS and reply["data"] == {"ok": True}

    trio.run(main)
    # a client that waited for HELLO_OK would have sent nothing more: the daemon would have
    # waited (the deadline) with HELLO alone
    assert seen == [[int(MessageType.HELLO), int(MessageType.STATUS_REQ)]]


def test_a_refused_hello_is_the_daemons_error_and_the_request_is_not_run(tmp_path: Path) -> None:
    """A daemon of another protocol version refuses HELLO: the client raises its error, and the
    request that came with HELLO is never handled."""

    class Handler:
        node_name, peer_id = "n1", "p"
        handled: list[object] = []

        async def handle_control(self, msg: object, out: FramedStream) -> None:
            self.handled.append(msg)

    handler = Handler()
    server = ControlServer(tmp_path / "meshd.sock", handler)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(server.run)
            import meshd.control.client as client
            real = client.CONTROL_VERSION
            client.CONTROL_VERSION = real + 1  # this client speaks a version the daemon lacks
            try:
                with trio.fail_after(DEADLINE_S), pytest.raises(RemoteError) as err:
                    await call(str(tmp_path / "meshd.sock"), MessageType.STATUS_REQ, {})
            finally:
                client.CONTROL_VERSION = real
            assert err.value.code == ErrorCode.UNSUPPORTED
            assert "version" in str(err.value)
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert handler.handled == []
