"""Length-prefixed msgpack frames over any byte stream (a libp2p stream or a unix socket).

The adapter between trio I/O and the sans-I/O ``FrameDecoder``. Foreign exceptions of the
underlying stream are mapped to ``PeerGoneError``; bad bytes raise ``ProtocolError``.

``on_recv`` is called (no arguments, must not raise) whenever bytes arrive: the node counts any
frame as a sign of life of the peer. With ``idle_timeout_s``, a ``recv`` that waits longer than
that for bytes raises ``PeerGoneError``, so a silent peer cannot hold a handler forever.

Writes are never cut short by cancellation. py-libp2p's Noise session encrypts a frame, which
advances its nonce, before the bytes reach the socket; a write cancelled in between (a request
cancelled while its task writes, a stream's reader cancelling its writers at the end) leaves the
nonce ahead of the wire, every later frame on that *connection* fails to decrypt, and the peer
drops the connection with all its streams. So a write, once started, is shielded and finishes;
only one stuck for ``send_timeout_s`` is abandoned (that connection is unusable anyway).

Ending a stream (``reset``) never throws away the last frames written. py-libp2p's yamux drops
whatever a stream still holds unread when an RST arrives for it, so an RST right behind a frame
can overtake it at the peer. A stream whose peer already ended its side (``recv`` returned None)
is ended with a FIN behind the data instead, and so is one whose last frame was an ERROR.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

import trio

from meshd.core.messages import MessageType
from meshd.core.wire import FrameDecoder, Message, frame
from meshd.errors import PeerGoneError

READ_CHUNK = 1 << 16
SEND_TIMEOUT_S = 30.0  # a write stuck this long (the peer reads nothing) is abandoned
END_TIMEOUT_S = 1.0  # closing or resetting a stream (one small frame)


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
    def __init__(
        self,
        stream: Any,
        max_frame: int,
        allowed: frozenset[int] | None = None,
        *,
        on_recv: Callable[[], None] | None = None,
        idle_timeout_s: float | None = None,
        send_timeout_s: float = SEND_TIMEOUT_S,
    ) -> None:
        self.stream = stream
        self._decoder = FrameDecoder(max_frame, allowed)
        self._ready: deque[Message] = deque()
        self._send_lock = trio.Lock()
        self._on_recv = on_recv
        self._idle_timeout = math.inf if idle_timeout_s is None else idle_timeout_s
        self._send_timeout = send_timeout_s
        self._last_sent: int | None = None  # type of the last frame written (if one frame)
        self._peer_ended = False  # the peer ended its side cleanly (recv returned None)
        self.bytes_in = 0
        self.bytes_out = 0
        self.frames_in = 0
        self.frames_out = 0

    async def send(self, mtype: MessageType, fields: dict[str, Any]) -> None:
        await self.send_raw(frame(mtype, fields))
        self._last_sent = int(mtype)

    async def send_raw(self, data: bytes) -> None:
        async with self._send_lock:
            with trio.CancelScope(shield=True):  # see the module docstring: never cut a write short
                with trio.move_on_after(self._send_timeout) as stuck:
                    try:
                        await self.stream.write(data)
                    except Exception as e:
                        raise PeerGoneError(f"stream write failed: {type(e).__name__}") from None
            if stuck.cancelled_caught:
                raise PeerGoneError(f"stream write stuck for {self._send_timeout:g} s")
        self._last_sent = None
        self.bytes_out += len(data)
        self.frames_out += 1

    async def recv(self) -> Message | None:
        """The next message, or None on a clean end of stream."""
        while not self._ready:
            with trio.move_on_after(self._idle_timeout) as idle:
                try:
                    data = await self.stream.read(READ_CHUNK)
                except (trio.Cancelled, trio.TooSlowError):
                    raise
                except Exception as e:
                    name = type(e).__name__
                    if "EOF" in name or "Closed" in name:
                        self._peer_ended = True
                        return None
                    raise PeerGoneError(f"stream read failed: {name}") from None
            if idle.cancelled_caught:
                raise PeerGoneError(f"stream idle: nothing received for {self._idle_timeout:g} s")
            if not data:
                self._peer_ended = True
                return None
            if self._on_recv is not None:
                self._on_recv()
            self.bytes_in += len(data)
            self._decoder.feed(data)
            self._ready.extend(self._decoder.messages())
        self.frames_in += 1
        return self._ready.popleft()

    async def close(self) -> None:
        with trio.CancelScope(shield=True), trio.move_on_after(END_TIMEOUT_S):
            try:
                await self.stream.close()
            except Exception:
                pass

    async def reset(self, grace_s: float = 2.0) -> None:
        """Drop the stream, without losing what was written last: a reset right behind a frame
        can make the peer's muxer discard it unread (py-libp2p's yamux drops a stream's buffer
        on RST). So if the peer already ended its side, close ours (FIN after the data): the
        stream is then over both ways and the reset below sends nothing. If the last frame
        written was an ERROR, close our side too, give the peer up to ``grace_s`` to read it and
        end its side, then reset whatever is left. Otherwise (a peer that vanished or broke the
        protocol mid-stream) reset at once."""
        try:
            graceful = self._peer_ended or self._last_sent == int(MessageType.ERROR)
            if graceful and getattr(self.stream, "reset", None) is not None:
                await self.close()
                if not self._peer_ended:
                    with trio.move_on_after(grace_s):
                        try:
                            while await self.stream.read(READ_CHUNK):
                                pass  # discard: we are done with this stream
                        except Exception:
                            pass  # the peer's end (EOF) or a broken stream: we are done
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(END_TIMEOUT_S):
                try:
                    reset = getattr(self.stream, "reset", None)
                    await (reset() if reset else self.stream.close())
                except Exception:
                    pass
