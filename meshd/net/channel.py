"""The request protocol's client side: one long-lived stream per peer, multiplexed by request id.

Opening a libp2p stream costs ~10 ms in py-libp2p 0.8.1, so an entry node keeps one stream
per peer and tags every frame with its request id. A reader task routes incoming frames to the
request that waits for them; a pinger measures RTT and declares the peer stalled when nothing
comes back for ``stall_timeout_s`` (a SIGSTOPped peer never closes its socket).
"""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncGenerator, Callable
from typing import Any

import trio

from meshd.core.messages import MessageType
from meshd.core.wire import Message
from meshd.errors import PeerGoneError, ProtocolError
from meshd.net.framed import FramedStream

log = logging.getLogger(__name__)

REQUEST_BUFFER = 1024


class PeerChannel:
    def __init__(
        self,
        peer_id: str,
        framed: FramedStream,
        *,
        ping_interval_s: float,
        stall_timeout_s: float,
        on_rtt: Callable[[str, float], None] | None = None,
        on_dead: Callable[[str, str], None] | None = None,
    ) -> None:
        self.peer_id = peer_id
        self.framed = framed
        self._ping_interval = ping_interval_s
        self._stall_timeout = stall_timeout_s
        self._on_rtt = on_rtt
        self._on_dead = on_dead
        self._waiting: dict[str, trio.MemorySendChannel[Message | Exception]] = {}
        self._pings: dict[int, float] = {}
        self._ping_n = 0
        self._last_heard = trio.current_time()
        self.dead: str | None = None
        self.rtt_ms: float = math.nan
        self.peer_queue: int | None = None
        self._cancel: trio.CancelScope | None = None
        self._syncs: dict[int, trio.MemorySendChannel[dict[str, Any]]] = {}

    @property
    def alive(self) -> bool:
        return self.dead is None

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Read and ping until the stream ends or the peer stalls; then fail what waits."""
        reason = "closed"
        with trio.CancelScope() as scope:
            self._cancel = scope
            try:
                async with trio.open_nursery() as nursery:
                    if math.isfinite(self._ping_interval):  # else the owner pings (ping())
                        nursery.start_soon(self._pinger, nursery.cancel_scope)
                    task_status.started()
                    reason = await self._reader()
                    nursery.cancel_scope.cancel()
            except* (PeerGoneError, ProtocolError) as eg:  # the nursery wraps them in a group
                reason = str(eg.exceptions[0])
        if scope.cancelled_caught and reason == "closed":
            reason = self.dead or "stalled"
        self._fail_all(reason)
        await self.framed.reset()

    def close(self, reason: str) -> None:
        if self.dead is None:
            self.dead = reason
        if self._cancel is not None:
            self._cancel.cancel()

    async def _reader(self) -> str:
        while True:
            msg = await self.framed.recv()
            if msg is None:
                return "stream closed"
            self._last_heard = trio.current_time()
            t = msg["t"]
            if t == MessageType.PONG:
                sent = self._pings.pop(msg["n"], None)
                if sent is not None:
                    self.rtt_ms = (trio.current_time() - sent) * 1000.0
                    if self._on_rtt:
                        self._on_rtt(self.peer_id, self.rtt_ms)
                q = msg.get("queue")
                if isinstance(q, int):
                    self.peer_queue = q
                continue
            if t == MessageType.PING:
                await self.framed.send(MessageType.PONG, {"n": msg["n"]})
                continue
            if t == MessageType.SYNC:
                waiter = self._syncs.pop(msg["n"], None)
                if waiter is not None:
                    waiter.send_nowait(msg)
                continue
            rid = msg.get("rid")
            chan = self._waiting.get(rid) if isinstance(rid, str) else None
            if chan is None:
                continue  # a late frame of a request we gave up on
            try:
                chan.send_nowait(msg)
            except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
                self._waiting.pop(rid, None)  # type: ignore[arg-type]

    async def _pinger(self, scope: trio.CancelScope) -> None:
        while True:
            now = trio.current_time()
            if now - self._last_heard > self._stall_timeout:
                self.dead = f"stalled: no answer for {now - self._last_heard:.1f} s"
                log.warning("peer stalled peer=%s", self.peer_id)
                scope.cancel()
                return
            try:
                with trio.fail_after(self._stall_timeout):
                    await self.ping()
            except (PeerGoneError, trio.TooSlowError) as e:
                self.dead = f"ping failed: {e}"
                scope.cancel()
                return
            await trio.sleep(self._ping_interval)

    @property
    def in_flight(self) -> int:
        """Requests of ours waiting on this channel."""
        return len(self._waiting)

    async def ping(self) -> None:
        """Send one PING now; its PONG feeds ``on_rtt``. Raises ``PeerGoneError``."""
        self._ping_n += 1
        self._pings[self._ping_n] = trio.current_time()
        if len(self._pings) > 16:
            self._pings.pop(min(self._pings))
        await self.framed.send(MessageType.PING, {"n": self._ping_n})

    def _fail_all(self, reason: str) -> None:
        if self.dead is None:
            self.dead = reason
        if self._on_dead:
            self._on_dead(self.peer_id, self.dead)
        for chan in list(self._waiting.values()):
            try:
                chan.send_nowait(PeerGoneError(f"peer {self.peer_id[-8:]} gone: {self.dead}"))
            except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
                pass
        self._waiting.clear()

    async def sync(self, timeout_s: float, own: list[bytes] | None = None) -> list[Any]:
        """Hand the peer our own signed advert(s) and ask for the adverts it holds (SYNC_REQ ->
        SYNC); [] if it cannot say in time."""
        return list((await self.sync_reply(timeout_s, own)).get("adverts") or [])

    async def sync_reply(self, timeout_s: float, own: list[bytes] | None = None, *,
                         fresh: bool = False, summaries_only: bool = False) -> dict[str, Any]:
        """``sync``'s whole SYNC answer (adverts, and the summaries a node with cells holds);
        ``fresh``: a probe, answered with the peer's own advert signed now. {} if no answer in
        time."""
        if self.dead is not None:
            return {}
        self._ping_n += 1
        n = self._ping_n
        send, recv = trio.open_memory_channel[dict[str, Any]](1)
        self._syncs[n] = send
        fields: dict[str, Any] = {"n": n, "adverts": own or []}
        if fresh:
            fields["fresh"] = True
        if summaries_only:
            fields["summaries_only"] = True
        try:
            with trio.move_on_after(timeout_s):
                await self.framed.send(MessageType.SYNC_REQ, fields)
                return await recv.receive()
        except PeerGoneError:
            pass
        finally:
            self._syncs.pop(n, None)
        return {}

    async def request(
        self, fields: dict[str, Any], *, mtype: MessageType = MessageType.REQ,
        ends: Callable[[Message], bool] | None = None,
    ) -> AsyncGenerator[Message, None]:
        """Send a REQ (or another request ``mtype`` that carries ``rid``, such as TOK_REQ) and
        yield the frames answering it until DONE or ERROR, or a frame ``ends`` says is the last
        (inclusive).

        Raises ``PeerGoneError`` if the peer dies or stalls first. Leaving the iterator early
        (the client went away) sends CANCEL so the peer stops working on it.
        """
        if self.dead is not None:
            raise PeerGoneError(f"peer {self.peer_id[-8:]} is gone: {self.dead}")
        rid = fields["rid"]
        send, recv = trio.open_memory_channel[Message | Exception](REQUEST_BUFFER)
        self._waiting[rid] = send
        finished = False
        try:
            await self.framed.send(mtype, fields)
            async with recv:
                async for item in recv:
                    if isinstance(item, Exception):
                        raise item
                    if item["t"] in (MessageType.DONE, MessageType.ERROR) or (
                            ends is not None and ends(item)):
                        finished = True
                    yield item
                    if finished:
                        return
        finally:
            self._waiting.pop(rid, None)
            if not finished and self.dead is None:
                with trio.CancelScope(shield=True), trio.move_on_after(1):
                    try:
                        await self.framed.send(MessageType.CANCEL, {"rid": rid})
                    except PeerGoneError:
                        pass
