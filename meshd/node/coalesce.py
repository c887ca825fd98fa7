"""Coalesce a stream of tokens into frames: the first at once, then at most one per interval.

A libp2p stream carries ~1,200 frames/s in py-libp2p, so one frame per token caps a hop near
that rate; batching every ``interval_s`` lets one hop stream many thousands of tokens per second
while adding at most ``interval_s`` of delay to any token.

Written as a pump with a sink callback rather than an async generator, because a trio nursery
must not span a ``yield``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import trio

from meshd.core.messages import MessageType
from meshd.core.wire import frame
from meshd.errors import PeerGoneError

T = TypeVar("T")


async def pump_coalesced(
    source: AsyncIterator[T], interval_s: float, sink: Callable[[list[T]], Awaitable[None]]
) -> None:
    """Feed ``source`` to ``sink`` in batches. Errors of ``source`` propagate after the flush."""
    send, recv = trio.open_memory_channel[T](1 << 14)
    error: list[BaseException] = []

    async def produce() -> None:
        async with send:
            try:
                async for item in source:
                    await send.send(item)
            except Exception as e:
                error.append(e)
            finally:
                # Close an abandoned async generator here, in the task that iterated it: left
                # to the garbage collector, its cleanup (the runner releasing its model slot)
                # runs in another task and fails, and the slot is lost for good.
                aclose = getattr(source, "aclose", None)
                if aclose is not None:
                    with trio.CancelScope(shield=True):
                        await aclose()

    async def consume() -> None:
        last = -1e9
        async with recv:
            while True:
                try:
                    first = await recv.receive()
                except trio.EndOfChannel:
                    return
                wait = last + interval_s - trio.current_time()
                if wait > 0:
                    await trio.sleep(wait)
                batch = [first]
                while True:
                    try:
                        batch.append(recv.receive_nowait())
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break
                last = trio.current_time()
                await sink(batch)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(produce)
        nursery.start_soon(consume)
    if error:
        raise error[0]


class FrameBatcher:
    """One write per interval for every request on a stream: concurrent requests share writes.

    py-libp2p spends ~0.5 ms of CPU per write at each end (yamux, Noise, the read loop) whatever
    its size, so K requests each flushing every ``interval_s`` would cost K writes per interval.
    Here the tokens of each request collect in a buffer (``token``: synchronous, no await and no
    task switch per token) and one task writes the TOKENS frames of every request with news,
    back to back, in a single ``send_raw``. A request's first tokens and its final frame
    (``finish``) go out at once; otherwise at most one write per ``interval_s``, or sooner once
    a request holds ``max_batch_tokens``. A request's frames keep their order.
    """

    def __init__(self, framed: Any, interval_s: float, *, max_batch_tokens: int = 1024,
                 stats: dict[str, int] | None = None) -> None:
        self._framed = framed
        self._interval = interval_s
        self._max_batch = max_batch_tokens
        # (rid, choice) -> token ids not yet written, their text, their log probabilities
        self._ids: dict[tuple[str, int], list[int]] = {}
        self._text: dict[tuple[str, int], list[str]] = {}
        self._lp: dict[tuple[str, int], list[Any]] = {}
        self._final: dict[str, bytes] = {}  # rid -> its DONE/ERROR frame, written after its tokens
        self._started: set[str] = set()  # requests whose first tokens were written
        self._news = False  # something waits to be written
        self._urgent = False  # ... and it should not wait for the interval
        self._wake = trio.Event()  # set once per batch, on its first news
        self._hurry = trio.Event()  # set once per batch, when it turns urgent
        self._closed = False
        # counts "token_writes", "token_frames" and "tokens_sent" (a dict shared by a server's
        # streams, for ``meshd status``)
        self.stats = stats if stats is not None else {}
        for k in ("token_writes", "token_frames", "tokens_sent"):
            self.stats.setdefault(k, 0)

    def token(self, rid: str, token_id: int, text: str, *, idx: int = 0,
              lp: list[Any] | None = None) -> None:
        """Queue one token of ``rid`` (of its choice ``idx``, with its log probabilities
        ``lp``); never blocks. Raises ``PeerGoneError`` once the stream has failed, so that the
        request stops generating for nobody."""
        if self._closed:
            raise PeerGoneError("request stream failed")
        key = (rid, idx)
        buf = self._ids.get(key)
        if buf is None:
            buf = self._ids[key] = []
            self._text[key] = []
        buf.append(token_id)
        self._text[key].append(text)
        if lp is not None:
            self._lp.setdefault(key, []).append(lp)
        if not self._news:
            self._news = True
            self._wake.set()
        if not self._urgent and (rid not in self._started or len(buf) >= self._max_batch):
            self._urgent = True
            self._hurry.set()

    def finish(self, rid: str, mtype: MessageType, fields: dict[str, Any]) -> None:
        """Queue the frame that ends ``rid`` (DONE or ERROR), after its tokens; written at once
        (dropped if the stream has failed)."""
        if self._closed:
            return
        self._final[rid] = frame(mtype, fields)
        self._news = self._urgent = True
        self._wake.set()
        self._hurry.set()

    def pending(self) -> int:
        """Tokens and final frames not written yet."""
        return sum(len(v) for v in self._ids.values()) + len(self._final)

    def _take(self) -> bytes:
        parts: list[bytes] = []
        ntok = 0
        for key, ids in self._ids.items():
            if ids:
                rid, idx = key
                fields: dict[str, Any] = {"rid": rid, "ids": ids, "text": "".join(self._text[key])}
                if idx:
                    fields["idx"] = idx
                lp = self._lp.pop(key, None)
                if lp is not None:
                    fields["lp"] = lp
                parts.append(frame(MessageType.TOKENS, fields))
                ntok += len(ids)
                self._started.add(rid)
                self._ids[key] = []
                self._text[key] = []
        for rid, data in self._final.items():
            parts.append(data)
            self._started.discard(rid)
            for key in [k for k in self._ids if k[0] == rid]:
                self._ids.pop(key, None)
                self._text.pop(key, None)
                self._lp.pop(key, None)
        self._final.clear()
        self.stats["token_frames"] += len(parts)
        self.stats["tokens_sent"] += ntok
        return b"".join(parts)

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Write batches until cancelled; stops writing when the stream fails (its reader then
        sees the end and cancels the requests)."""
        last = -1e9
        task_status.started()
        try:
            while True:
                await self._wake.wait()
                if not self._urgent:
                    with trio.move_on_at(last + self._interval):
                        await self._hurry.wait()
                self._wake, self._hurry = trio.Event(), trio.Event()
                self._news = self._urgent = False
                data = self._take()
                if data:
                    last = trio.current_time()
                    self.stats["token_writes"] += 1
                    await self._framed.send_raw(data)
        except PeerGoneError:
            self._closed = True
