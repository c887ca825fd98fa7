"""Length-prefixed msgpack frames over any byte stream (a libp2p stream or a unix socket).

The adapter between trio I/O and the sans-I/O ``FrameDecoder``. Foreign exceptions of the
underlying stream are mapped to ``PeerGoneError``; bad bytes raise ``ProtocolError``.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Protocol

import trio

from meshd.core.messages import MessageType
from meshd.core.wire import FrameDecoder, Message, frame
from meshd.errors import PeerGoneError

READ_CHUNK = 1 << 16


class ByteStream(Protocol):
    async def read(self, n: int = ...) -> bytes: ...
    async def write(self, data: bytes) -> None: ...
    async def close(self) -> None: ...


class TrioStreamAdapter:
    """Make a ``trio.abc.Stream`` look like a libp2p stream (read/write/close)."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self._s = stream

    async def read(self, n: int = READ_CHUNK) -> bytes:
        return await self._s.receive_some(n)

    async def write(self, data: bytes) -> None:
        await self._s.send_all(data)

    async def close(self) -> None:
        await self._s.aclose()

    async def reset(self) -> None:
        await self._s.aclose()


class FramedStream:
    def __init__(self, stream: Any, max_frame: int, allowed: frozenset[int] | None = None) -> None:
        self.stream = stream
        self._decoder = FrameDecoder(max_frame, allowed)
        self._ready: deque[Message] = deque()
        self._send_lock = trio.Lock()
        self.bytes_in = 0
        self.bytes_out = 0
        self.frames_in = 0
        self.frames_out = 0

    async def send(self, mtype: MessageType, fields: dict[str, Any]) -> None:
        await self.send_raw(frame(mtype, fields))

    async def send_raw(self, data: bytes) -> None:
        async with self._send_lock:
            try:
                await self.stream.write(data)
            except (trio.Cancelled, trio.TooSlowError):
                raise
            except Exception as e:
                raise PeerGoneError(f"stream write failed: {type(e).__name__}") from None
        self.bytes_out += len(data)
        self.frames_out += 1

    async def recv(self) -> Message | None:
        """The next message, or None on a clean end of stream."""
        while not self._ready:
            try:
                data = await self.stream.read(READ_CHUNK)
            except (trio.Cancelled, trio.TooSlowError):
                raise
            except Exception as e:
                name = type(e).__name__
                if "EOF" in name or "Closed" in name:
                    return None
                raise PeerGoneError(f"stream read failed: {name}") from None
            if not data:
                return None
            self.bytes_in += len(data)
            self._decoder.feed(data)
            self._ready.extend(self._decoder.messages())
        self.frames_in += 1
        return self._ready.popleft()

    async def close(self) -> None:
        with trio.move_on_after(1):
            try:
                await self.stream.close()
            except Exception:
                pass

    async def reset(self) -> None:
        with trio.move_on_after(1):
            try:
                reset = getattr(self.stream, "reset", None)
                await (reset() if reset else self.stream.close())
            except Exception:
                pass
