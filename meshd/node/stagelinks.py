"""Stage traffic between nodes: one long-lived ``/meshd/stage/1.0.0`` stream per peer.

Opening a libp2p stream costs ~10 ms in py-libp2p, so a node keeps one outbound stage stream
per peer, opened on first use, and every frame names its stage session (``rid``). Frames flow:

- the entry node sends ``STAGE_OPEN``/``STAGE_FREE`` to each stage and ``STAGE_STEP`` (token
  ids) to the first stage, on its outbound stream to that stage;
- a stage replies ``STAGE_READY``, ``STAGE_OUT`` (the last stage's token) and ``ERROR`` on the
  stream the ``STAGE_OPEN`` came in on, so they reach the entry node without another stream;
- a stage forwards its output (``STAGE_STEP``, activations) on its own outbound stream to the
  next stage: activations never pass through the entry node.

A ``Port`` is where frames for one peer go: a stream, or ``LocalPort`` when the peer is this
node (the entry node serves a stage itself, or two consecutive stages are on one node), which
hands the frame straight to ``dispatch`` with the same schema check as the wire. ``dispatch``
never blocks: frames for stage sessions go to the ``StageServer``; replies go to the entry
node's ``Watch`` of that request. When a stream ends (a SIGKILLed peer shows as EOF within
milliseconds) the watches of that peer hear ``("gone", peer_id)`` and the stage server frees
the sessions that the stream's peer opened.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

import multiaddr
import trio
from libp2p.peer.id import ID

from meshd.core.messages import REGISTRY, STAGE_PROTOCOL, STAGE_TYPES, MessageType, check_fields
from meshd.core.peertable import PeerEntry
from meshd.core.wire import MAX_STAGE_FRAME, Message
from meshd.errors import PeerGoneError, ProtocolError
from meshd.net.framed import FramedStream
from meshd.node.links import Links
from meshd.node.stages import Port, StageServer

log = logging.getLogger(__name__)

OPEN_STREAM_TIMEOUT_S = 5.0
SEND_TIMEOUT_S = 5.0
OPEN_RETRY_WAITS_S = (0.05, 0.2, 0.5, 1.0)
WATCH_BUFFER = 4096


class StreamPort:
    """Frames to a peer over one stage stream (either direction of it)."""

    def __init__(self, peer_id: str, framed: FramedStream, *, outbound: bool) -> None:
        self.peer_id = peer_id
        self.framed = framed
        self.outbound = outbound
        self.dead: str | None = None

    @property
    def alive(self) -> bool:
        return self.dead is None

    async def send(self, mtype: MessageType, fields: dict[str, Any]) -> None:
        if self.dead is not None:
            raise PeerGoneError(f"stage stream to {self.peer_id[-8:]} is closed: {self.dead}")
        with trio.fail_after(SEND_TIMEOUT_S):
            await self.framed.send(mtype, fields)


class LocalPort:
    """Frames to this node itself: checked like wire frames, dispatched without a stream."""

    def __init__(self, links: StageLinks) -> None:
        self.links = links
        self.peer_id = links.local_id

    @property
    def alive(self) -> bool:
        return True

    async def send(self, mtype: MessageType, fields: dict[str, Any]) -> None:
        msg = {"t": int(mtype), **fields}
        check_fields(REGISTRY[int(mtype)], msg)
        self.links.dispatch(msg, self, self.peer_id)
        await trio.lowlevel.checkpoint()


class Watch:
    """The entry node's view of one pipeline attempt: replies to its sessions, and peers gone."""

    def __init__(self, sids: set[str], peers: set[str]) -> None:
        self.sids = sids
        self.peers = peers
        self.send, self.recv = trio.open_memory_channel[tuple[str, Any]](WATCH_BUFFER)

    def push(self, item: tuple[str, Any]) -> None:
        try:
            self.send.send_nowait(item)
        except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
            pass


class StageNet(Protocol):
    """What stage streams need of the node (``meshd.node.node.Node``): its id, and once it runs
    its libp2p host and its request links."""

    peer_id: str

    @property
    def host(self) -> Any: ...

    @property
    def links(self) -> Links | None: ...


class PeerLookup(Protocol):
    """The peer table's lookup (``meshd.core.peertable.PeerTable``)."""

    def get(self, peer_id: str) -> PeerEntry | None: ...


class StageLinks:
    def __init__(self, net: StageNet, server: StageServer, peers: PeerLookup) -> None:
        self.net = net
        self.server = server
        self.peers = peers
        self.local_id: str = net.peer_id
        self.local = LocalPort(self)
        self.out: dict[str, StreamPort] = {}
        self._locks: dict[str, trio.Lock] = {}
        self._watches: dict[str, Watch] = {}  # sid -> watch
        self._nursery: trio.Nursery | None = None
        self.stats = {"streams_out": 0, "streams_in": 0, "stream_failures": 0, "malformed": 0,
                      "unrouted": 0, "bytes_out_closed": 0, "frames_out_closed": 0}

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    # ------------------------------------------------------------------ ports

    async def port(self, peer_id: str) -> Port:
        """The port to ``peer_id``: this node itself, or its stage stream (opened once)."""
        if peer_id == self.local_id:
            return self.local
        p = self.out.get(peer_id)
        if p is not None and p.alive:
            return p
        lock = self._locks.setdefault(peer_id, trio.Lock())
        async with lock:
            p = self.out.get(peer_id)
            if p is not None and p.alive:
                return p
            return await self._open(peer_id)

    def open_port(self, peer_id: str) -> Port | None:
        """The port to ``peer_id`` if one is open now (never opens a stream)."""
        if peer_id == self.local_id:
            return self.local
        p = self.out.get(peer_id)
        return p if p is not None and p.alive else None

    async def _open(self, peer_id: str) -> StreamPort:
        host = self.net.host
        entry = self.peers.get(peer_id)
        try:
            pid = ID.from_base58(peer_id)
            if entry is not None:
                addrs = []
                for a in entry.advert.addrs:
                    try:
                        addrs.append(multiaddr.Multiaddr(a))
                    except Exception:
                        continue
                if addrs:
                    host.get_peerstore().add_addrs(pid, addrs, 600)
        except Exception as e:
            self.stats["stream_failures"] += 1
            raise PeerGoneError(f"cannot open a stage stream to {peer_id[-8:]}: {e!r}") from None
        stream = None
        with trio.move_on_after(OPEN_STREAM_TIMEOUT_S):
            for i, wait in enumerate(OPEN_RETRY_WAITS_S):
                # a connection that loses a simultaneous-dial race is torn down under us: after
                # a failure the node's links settle the connection, then the stream opens on
                # the survivor (not before: that would wait on the request channel's set-up)
                try:
                    links = self.net.links
                    if i > 0 and links is not None and self.peers.get(peer_id) is not None:
                        await links.channel(peer_id)
                    stream = await host.new_stream(pid, [STAGE_PROTOCOL])
                    break
                except Exception as e:
                    self.stats["stream_failures"] += 1
                    log.warning("stage stream open failed peer=%s error=%r", peer_id, e)
                    if self.peers.get(peer_id) is None:
                        break  # a peer the mesh no longer lists: do not keep trying
                    await trio.sleep(wait)
        if stream is None:
            raise PeerGoneError(f"cannot open a stage stream to {peer_id[-8:]}")
        framed = FramedStream(stream, MAX_STAGE_FRAME, STAGE_TYPES)
        port = StreamPort(peer_id, framed, outbound=True)
        self.out[peer_id] = port
        self.stats["streams_out"] += 1
        assert self._nursery is not None
        self._nursery.start_soon(self._read, port)
        return port

    async def on_stream(self, stream: Any) -> None:
        """Handler of inbound stage streams (wrapped by the node's guard)."""
        peer = stream.muxed_conn.peer_id.to_base58()
        self.stats["streams_in"] += 1
        port = StreamPort(peer, FramedStream(stream, MAX_STAGE_FRAME, STAGE_TYPES), outbound=False)
        await self._read(port)

    async def _read(self, port: StreamPort) -> None:
        reason = "stream closed"
        try:
            while True:
                msg = await port.framed.recv()
                if msg is None:
                    break
                self.dispatch(msg, port, port.peer_id)
        except ProtocolError as e:
            self.stats["malformed"] += 1
            reason = f"malformed frame: {e}"
            log.info("malformed stage frame peer=%s error=%s", port.peer_id, e)
            with trio.move_on_after(1):
                try:
                    await port.framed.send(MessageType.ERROR, {"code": e.code, "message": str(e)[:500]})
                except Exception:
                    pass
        except PeerGoneError as e:
            reason = str(e)
        except Exception:  # never let a peer crash the node
            log.exception("stage stream failed peer=%s", port.peer_id)
            reason = "internal error"
        finally:
            port.dead = reason
            if self.out.get(port.peer_id) is port:
                del self.out[port.peer_id]
            if port.outbound:
                self.stats["bytes_out_closed"] += port.framed.bytes_out
                self.stats["frames_out_closed"] += port.framed.frames_out
            self._gone(port, reason)
            await port.framed.reset()

    def _gone(self, port: StreamPort, reason: str) -> None:
        self.server.on_port_closed(port, reason)
        if port.outbound:
            for w in {id(w): w for w in self._watches.values()}.values():
                if port.peer_id in w.peers:
                    w.push(("gone", {"peer": port.peer_id, "reason": reason}))

    # ------------------------------------------------------------------ dispatch

    def dispatch(self, msg: Message, port: Port, from_peer: str) -> None:
        """Route one frame; never blocks and never raises for a peer's frame."""
        t = msg["t"]
        if t == MessageType.STAGE_OPEN:
            self.server.on_open(msg, port, from_peer)
        elif t == MessageType.STAGE_STEP:
            self.server.on_step(msg, port, from_peer)
        elif t == MessageType.STAGE_FREE:
            self.server.on_free(msg["rid"], from_peer)
        elif t in (MessageType.STAGE_READY, MessageType.STAGE_OUT, MessageType.ERROR):
            w = self._watches.get(msg.get("rid") or "")
            if w is not None:
                w.push(("msg", {**msg, "from": from_peer}))
            elif t == MessageType.ERROR:
                self.server.on_downstream_error(msg, from_peer)
            else:
                self.stats["unrouted"] += 1

    # ------------------------------------------------------------------ watches

    def watch(self, sids: set[str], peers: set[str]) -> Watch:
        w = Watch(set(sids), {p for p in peers if p != self.local_id})
        for sid in sids:
            self._watches[sid] = w
        for p in w.peers:  # a stream that is already gone will never report it
            port = self.out.get(p)
            if port is not None and not port.alive:
                w.push(("gone", {"peer": p, "reason": port.dead}))
        return w

    def unwatch(self, w: Watch) -> None:
        for sid in w.sids:
            if self._watches.get(sid) is w:
                del self._watches[sid]
        w.send.close()

    def statistics(self) -> dict[str, Any]:
        """Counters; ``bytes_out``/``frames_out``: every frame sent on outbound stage streams
        (length prefix and msgpack body; libp2p's yamux and Noise framing not counted)."""
        live = list(self.out.values())
        return {**self.stats, "streams_open": sum(1 for p in live if p.alive),
                "watches": len({id(w) for w in self._watches.values()}),
                "bytes_out": self.stats["bytes_out_closed"] + sum(p.framed.bytes_out for p in live),
                "frames_out": self.stats["frames_out_closed"] + sum(p.framed.frames_out for p in live)}
