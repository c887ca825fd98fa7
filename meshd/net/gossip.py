"""Gossipsub for adverts and revocations, hardened against py-libp2p 0.8.1's failure modes.

See ``shared/LIBP2P-NOTES.md``: malformed bytes on the gossipsub stream and a raising validator
each crash the whole host, so the pubsub stream handler is re-registered wrapped, and every
validator is wrapped to turn any exception into a rejection. Only ``/meshsub/1.1.0`` and
``1.0.0`` are offered (1.2's IDONTWANT doubled CPU for small messages), spam protection is off on
our topics (the publisher's own adverts count against it), and the heartbeat is 1 s rather than
the library's 120 s so meshes form promptly.

CPU matters (20 daemons share 2 cores in the benchmark): the library's "adaptive gossip" is off
(on a health score it moves the heartbeat to 30-60 s and widens the mesh, so the mesh we
configure is the mesh we get), and the signed peer record that py-libp2p attaches to every RPC
is verified once per distinct record and peer instead of on every RPC (an Ed25519 check and a
peerstore update each time, ~0.5 ms), and our own record is looked up once per
``RECORD_REUSE_S`` instead of for every message sent or forwarded (the lookup rebuilds the host's
address list through multiaddr parsing, ~1 ms). The record only feeds the certified address
book, which meshd does not use: peers are attested on connect.

Memory: py-libp2p's ``GossipSub.publish`` appends the time of every message it publishes or
forwards to ``recent_message_deliveries[topic]`` and trims that list only in the adaptive-gossip
health check, which is off here; so the list grew by one float per advert for as long as the
daemon ran (found by the soak: ~160 entries a minute at 5 nodes, linear over 30 minutes, and
proportional to the mesh's advert rate). ``open_gossip`` gives the router lists that keep only
their newest ``RECENT_DELIVERIES_MAX`` entries.

``on_heard(peer_id_base58)``, when set, is called whenever bytes arrive on a peer's gossip
stream: the node counts them as a sign of life of that peer (no ping needed).
"""

from __future__ import annotations

import logging
import time
import weakref
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import libp2p.pubsub.gossipsub as _gossipsub_mod
import libp2p.pubsub.pubsub as _pubsub_mod
import trio
from libp2p.peer.id import ID
from libp2p.peer.peerstore import env_to_send_in_RPC as _own_record
from libp2p.pubsub.gossipsub import PROTOCOL_ID, PROTOCOL_ID_V11, GossipSub
from libp2p.pubsub.pubsub import Pubsub
from libp2p.pubsub.utils import maybe_consume_signed_record as _verify_record
from libp2p.tools.anyio_service import background_trio_service

log = logging.getLogger(__name__)

# validator(author_peer_id_base58, data) -> True to accept. Must not raise; we guard anyway.
Validator = Callable[[str, bytes], bool]

RECORD_CACHE_MAX = 4096  # (peer, record) pairs remembered per host
RECORD_REUSE_S = 30.0  # our own signed record is rebuilt at most this often
RECENT_DELIVERIES_MAX = 1024  # delivery times the router keeps per topic (see the docstring)
_clock = time.monotonic


class Gossip:
    """A started gossipsub instance; use ``open_gossip`` to get one."""

    def __init__(self, pubsub: Pubsub, router: GossipSub) -> None:
        self.pubsub = pubsub
        self.router = router
        self.on_heard: Callable[[str], None] | None = None
        # bytes_in: every byte read from peers' gossip streams (the cost cells bound)
        self.stats = {"handler_errors": 0, "validator_errors": 0, "rejected": 0, "published": 0,
                      "bytes_in": 0, "streams_reopened": 0}
        # what pubsub writes to peers, one RPC per write (each write is one or more syscalls)
        self.sent = {"rpcs": 0, "messages": 0, "ihave": 0, "iwant": 0, "graft": 0, "prune": 0,
                     "subscriptions": 0}

    def set_validator(self, topic: str, validator: Validator) -> None:
        def guarded(forwarder: ID, msg: Any) -> bool:
            try:
                author = ID(msg.from_id).to_base58()
                ok = bool(validator(author, bytes(msg.data)))
            except Exception:
                self.stats["validator_errors"] += 1
                log.warning("gossip validator raised topic=%s", topic, exc_info=True)
                ok = False
            if not ok:
                self.stats["rejected"] += 1
            return ok

        self.pubsub.set_topic_validator(topic, guarded, False)

    async def subscribe(self, topic: str) -> Any:
        return await self.pubsub.subscribe(topic)

    async def publish(self, topic: str, data: bytes) -> None:
        await self.pubsub.publish(topic, data)
        self.stats["published"] += 1

    def mesh_size(self, topic: str) -> int:
        return len(self.router.mesh.get(topic, ()))

    def has_stream(self, peer_id: ID) -> bool:
        """Whether pubsub holds its stream to this peer (it sends our subscriptions and
        messages over it; a connected peer without one never hears from us nor we from it),
        or is getting one: it is retrying the open itself, or it refuses the peer on purpose
        (blacklisted)."""
        ps = self.pubsub
        return (peer_id in ps.peers or peer_id in getattr(ps, "_peer_stream_retries_pending", ())
                or ps.is_peer_blacklisted(peer_id))

    async def reopen_stream(self, peer_id: ID) -> None:
        """Ask pubsub again for its stream to a connected peer. py-libp2p retries the stream
        open only after a ``SwarmException``; one that fails otherwise (a protocol negotiation
        timed out, seen when 40 daemons start at once on 2 cores) leaves the peer connected
        and outside gossip for good. Uses pubsub's own registration (a private method: pinned
        libp2p version); a failure is logged there, and the caller tries again later."""
        self.stats["streams_reopened"] += 1
        await self.pubsub._handle_new_peer_safe(peer_id)

    def _guard_stream_handler(self) -> None:
        inner = self.pubsub.stream_handler

        async def guarded(stream: Any) -> None:
            try:
                self._watch(stream)
                await inner(stream)
            except Exception as e:
                self.stats["handler_errors"] += 1
                peer = getattr(getattr(stream, "muxed_conn", None), "peer_id", None)
                log.warning("gossip stream dropped peer=%s error=%s", peer, type(e).__name__)
                with trio.move_on_after(1):
                    try:
                        await stream.reset()
                    except Exception:
                        pass

        for proto in self.router.get_protocols():
            self.pubsub.host.set_stream_handler(proto, guarded)

    def _watch(self, stream: Any) -> None:
        """Count every read on a peer's inbound gossip stream, and report it to ``on_heard``."""
        try:
            peer = stream.muxed_conn.peer_id.to_base58()
            read = stream.read
        except Exception:  # not a stream we know how to watch: serve it unwatched
            return
        gossip = self

        async def watched_read(n: int | None = None) -> bytes:
            data: bytes = await read(n)
            hook = gossip.on_heard
            if data:
                gossip.stats["bytes_in"] += len(data)
                if hook is not None:
                    hook(peer)
            return data

        stream.read = watched_read

    def _count_writes(self) -> None:
        """Count what pubsub sends, by kind: ``meshd status --json`` shows it under
        ``services.gossip.sent`` (each RPC is a write through yamux, noise and the socket, the
        cost that dominates a daemon's gossip CPU)."""
        inner = self.pubsub.write_msg
        sent = self.sent

        async def counted(stream: Any, rpc: Any) -> bool:
            sent["rpcs"] += 1
            sent["messages"] += len(rpc.publish)
            sent["subscriptions"] += len(rpc.subscriptions)
            if rpc.HasField("control"):
                c = rpc.control
                sent["ihave"] += len(c.ihave)
                sent["iwant"] += len(c.iwant)
                sent["graft"] += len(c.graft)
                sent["prune"] += len(c.prune)
            return await inner(stream, rpc)

        self.pubsub.write_msg = counted  # type: ignore[method-assign,assignment]

    def _guard_push_msg(self) -> None:
        """pubsub runs ``push_msg`` for every received message as a task of its service: an
        exception there (py-libp2p's signature check raises DecodeError on a garbage ``key``
        field) stops the service and with it the host. Drop such a message instead."""
        inner = self.pubsub.push_msg
        my_id = self.pubsub.my_id

        async def guarded(forwarder: ID, msg: Any) -> None:
            if forwarder == my_id:
                await inner(forwarder, msg)  # our own publish: let the caller see its errors
                return
            try:
                await inner(forwarder, msg)
            except Exception as e:
                self.stats["handler_errors"] += 1
                log.warning("gossip message dropped peer=%s error=%s", forwarder, type(e).__name__)

        self.pubsub.push_msg = guarded  # type: ignore[method-assign,assignment]


_records: weakref.WeakKeyDictionary[Any, dict[tuple[ID, bytes], bool]] = weakref.WeakKeyDictionary()


def _consume_record_once(msg: Any, host: Any, peer_id: ID) -> bool:
    """``maybe_consume_signed_record`` with a memory: the same record bytes from the same peer
    were verified and stored already, and verifying them again gives the same answer."""
    if not msg.HasField("senderRecord"):
        return True
    try:
        seen = _records.setdefault(host, {})
    except TypeError:  # not weak-referenceable: no cache
        return bool(_verify_record(msg, host, peer_id))
    key = (peer_id, bytes(msg.senderRecord))
    if key in seen:
        return True
    ok = bool(_verify_record(msg, host, peer_id))
    if ok:
        if len(seen) >= RECORD_CACHE_MAX:
            seen.clear()
        seen[key] = True
    return ok


_own: weakref.WeakKeyDictionary[Any, tuple[float, bytes]] = weakref.WeakKeyDictionary()


def _own_record_reused(host: Any) -> tuple[bytes, bool]:
    """``env_to_send_in_RPC`` looked up at most once per ``RECORD_REUSE_S`` per host."""
    now = _clock()
    try:
        hit = _own.get(host)
    except TypeError:  # not weak-referenceable: no cache
        return _own_record(host)
    if hit is not None and now < hit[0]:
        return hit[1], False
    env, fresh = _own_record(host)
    _own[host] = (now + RECORD_REUSE_S, env)
    return env, fresh


def _install_record_cache() -> None:
    """Process-wide: py-libp2p calls these functions by their module-level names."""
    for mod in (_pubsub_mod, _gossipsub_mod):
        if getattr(mod, "maybe_consume_signed_record", None) is _verify_record:
            mod.maybe_consume_signed_record = _consume_record_once  # type: ignore[attr-defined]
        if getattr(mod, "env_to_send_in_RPC", None) is _own_record:
            mod.env_to_send_in_RPC = _own_record_reused  # type: ignore[attr-defined]


class RecentTimes(list[float]):
    """A list that keeps only its newest ``RECENT_DELIVERIES_MAX`` items as it is appended to
    (still a list: the library's own trimming assigns to a slice of it)."""

    def append(self, item: float) -> None:
        super().append(item)
        excess = len(self) - RECENT_DELIVERIES_MAX
        if excess > 0:
            del self[:excess]


def no_opportunistic_grafting(router: GossipSub) -> None:
    """Turn off the router's opportunistic grafting.

    go-libp2p grafts opportunistically once a minute, and only when the median score of a
    topic's mesh falls below a threshold (0 by default). The pinned py-libp2p does it on every
    heartbeat, against a threshold derived from that median. meshd scores no peer (every weight
    is 0), so every peer outside the mesh qualifies. Each heartbeat then grafts it, the mesh
    climbs past D_high, and the router prunes with a 60 s back-off. When that back-off ends the
    whole cycle repeats.

    Measured on 20 daemons: 0.4 GRAFT and 0.4 PRUNE sent per node per second in bursts a minute
    apart, a quarter of all gossip RPCs, on every topic."""
    router._perform_opportunistic_grafting = lambda topic, peers_to_graft: 0  # type: ignore[method-assign]


def bound_router_memory(router: GossipSub) -> None:
    """Replace the router's per-topic delivery-time lists with bounded ones."""
    router.recent_message_deliveries = defaultdict(RecentTimes)


@asynccontextmanager
async def open_gossip(
    host: Any,
    *,
    degree: int = 4,
    heartbeat_interval_s: float = 1.0,
    ihave_window: int = 0,
) -> AsyncIterator[Gossip]:
    """Start gossipsub on ``host``. ``ihave_window``: how many heartbeats of recent message ids
    each heartbeat announces (IHAVE) to up to six peers outside the mesh, per topic; 0 sends no
    IHAVE, and a message then travels over the mesh links only (see docs/gossip-at-scale.md)."""
    router = GossipSub(
        [PROTOCOL_ID_V11, PROTOCOL_ID],
        degree=degree,
        degree_low=max(2, degree - 1),
        degree_high=degree + 2,
        heartbeat_interval=max(1, round(heartbeat_interval_s)),
        heartbeat_initial_delay=0.1,
        gossip_window=ihave_window,
        spam_protection_enabled=False,
        eclipse_protection_enabled=False,
        adaptive_gossip_enabled=False,
    )
    bound_router_memory(router)
    no_opportunistic_grafting(router)
    _install_record_cache()
    pubsub = Pubsub(host, router, strict_signing=True)
    gossip = Gossip(pubsub, router)
    gossip._guard_stream_handler()
    gossip._guard_push_msg()
    gossip._count_writes()
    async with AsyncExitStack() as stack:
        await stack.enter_async_context(background_trio_service(pubsub))
        await stack.enter_async_context(background_trio_service(router))
        await pubsub.wait_until_ready()
        yield gossip
