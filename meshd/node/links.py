"""Links to peers: dialling, one long-lived request channel per peer, liveness.

Every peer heard in an advert gets a direct connection and a request channel (up to
``max_peers``), so forwarding never pays a dial or a stream open. Liveness (``liveness.py``)
counts every frame from a peer, on any stream, as a sign of life; pings go out only for RTT
samples (Vivaldi) every ``ping_interval_s`` and to silent peers our requests wait on, and a peer
that answers nothing is stalled. A lost connection or a stalled channel drops the peer from the
table at once; its next advert brings it back and it is redialled (after clearing py-libp2p's
60 s dial block).

Joining: right after a bootstrap peer is dialled, a channel to it is opened and synced
(SYNC_REQ/SYNC), so a new node knows the mesh one round trip after its first connection.
When two nodes learn of each other at the same moment (a join gossiped to everyone), the one
whose peer id sorts higher gives the other a moment to dial first, so one connection (one
Noise handshake and attestation each side) is made instead of two.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import multiaddr
import trio
from libp2p.abc import INotifee
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo, info_from_p2p_addr

from meshd.config import Config
from meshd.core.advert import Advert
from meshd.core.messages import REQUEST_PROTOCOL, REQUEST_TYPES
from meshd.core.peertable import PeerTable
from meshd.core.wire import MAX_REQUEST_FRAME
from meshd.errors import PeerGoneError
from meshd.net.channel import PeerChannel
from meshd.net.framed import FramedStream
from meshd.node.liveness import Liveness

log = logging.getLogger(__name__)

DIAL_TIMEOUT_S = 5.0
BOOTSTRAP_RETRY_S = 2.0
BOOTSTRAP_KEEP_S = 5.0  # how often a connected node checks its bootstrap links are still up
ADDR_TTL_S = 600
LIVENESS_TICK_S = 0.25  # the liveness loop's resolution
LIVENESS_IDLE_S = 1.0  # its longest sleep: a request that starts meanwhile is watched this late
DIAL_YIELD_S = 0.3  # the higher peer id waits this long for the other side's dial


class LinkedMembership(Protocol):
    """What links need of membership (``meshd.node.membership.Membership``)."""

    peer_id: str
    table: PeerTable
    revoked_peer_ids: set[str]
    joined: trio.Event  # links set it once a bootstrap peer's SYNC answered (or there is none)

    def own_signed_advert(self) -> bytes | None: ...

    async def publish_advert(self) -> None: ...

    def accept_synced(self, items: list[Any]) -> int: ...

    def pulls_due(self, now: float, linked: Sequence[str]) -> list[str]: ...

    def accept_probed(self, peer_id: str, items: list[Any], *, pulled: bool = False) -> bool: ...

    def drop_peer(self, peer_id: str) -> bool: ...

    def on_rtt(self, peer_id: str, raw_ms: float) -> None: ...


class GossipStreams(Protocol):
    """What links need of gossip (``meshd.net.gossip.Gossip``): its stream to each peer."""

    def has_stream(self, peer_id: ID) -> bool: ...

    async def reopen_stream(self, peer_id: ID) -> None: ...


class Links:
    def __init__(self, host: Any, config: Config, membership: LinkedMembership, *,
                 rng: random.Random | None = None) -> None:
        # host: the libp2p host (its IHost type lacks the swarm's unblock_peer, hence Any)
        self.host = host
        self.config = config
        self.membership = membership
        self.channels: dict[str, PeerChannel] = {}
        self._opening: dict[str, trio.Event] = {}
        self._nursery: trio.Nursery | None = None
        g = config.gossip
        self.liveness = Liveness(ping_interval_s=g.ping_interval_s, busy_silence_s=g.busy_ping_after_s,
                                 stall_timeout_s=g.stall_timeout_s, rng=rng)
        self.stats = {"dials": 0, "dial_failures": 0, "dials_yielded": 0, "channels_opened": 0,
                      "stalls": 0, "pings": 0, "pulls": 0, "pulls_answered": 0, "pull_bytes_in": 0,
                      "gossip_streams_missing": 0}
        # what a SYNC brought besides adverts (cells: the summaries the peer holds)
        self.on_sync_summaries: Callable[[list[Any]], None] | None = None
        # gossip's stream to each connected peer, checked every BOOTSTRAP_KEEP_S (set by the node)
        self.gossip: GossipStreams | None = None
        self._no_stream: dict[str, int] = {}  # connected peer -> checks in a row without one
        self._reopening: set[str] = set()
        self._bootstrap_ids: set[ID] = set()

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Own the links' tasks (dials, channels, pings) and run the liveness loop; the
        bootstrap peers are dialled once ``join`` is called."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self.liveness_loop)
            nursery.start_soon(self.gossip_streams_loop)
            task_status.started()

    @property
    def nursery(self) -> trio.Nursery:
        assert self._nursery is not None, "Links.run has not started"
        return self._nursery

    def join(self) -> None:
        """Dial the bootstrap peers of the config (and keep them connected)."""
        self.nursery.start_soon(self.bootstrap_loop, list(self.config.node.bootstrap))

    # ---------------------------------------------------------------- dialling

    async def bootstrap_loop(self, addrs: list[str]) -> None:
        """Dial each bootstrap address until it connects, then keep it connected: a node whose
        links all dropped (a partition, a peer that froze and thawed) has no adverts left to
        find anyone by, so the bootstrap peers are how it gets back into the mesh."""
        infos = []
        for a in addrs:
            try:
                infos.append(info_from_p2p_addr(multiaddr.Multiaddr(a)))
            except Exception:
                log.error("bad bootstrap address (needs /p2p/<peer id>) addr=%s", a)
        if not infos:
            self.membership.joined.set()
        self._bootstrap_ids = {info.peer_id for info in infos}
        while infos:
            pending = False
            for info in infos:
                if info.peer_id.to_base58() in self.membership.revoked_peer_ids:
                    continue
                if self._connected(info.peer_id):
                    peer = info.peer_id.to_base58()
                    ch = self.channels.get(peer)
                    if (ch is None or not ch.alive) and peer not in self._opening:
                        # connected, but its channel never opened (it timed out while the
                        # peer was busy) or closed: without it no sync, no pulls
                        self.nursery.start_soon(self._open_bootstrap, info.peer_id)
                    continue
                if await self._dial(info.peer_id, list(info.addrs)):
                    self.nursery.start_soon(self._open_bootstrap, info.peer_id)
                else:
                    pending = True
            await trio.sleep(BOOTSTRAP_RETRY_S if pending else BOOTSTRAP_KEEP_S)

    async def _open_bootstrap(self, pid: ID) -> None:
        """A bootstrap peer was just dialled: open the channel and sync now, not after its advert."""
        peer = pid.to_base58()
        try:
            ch = self.channels.get(peer)
            if (ch is None or not ch.alive) and peer not in self._opening:
                ev = self._opening[peer] = trio.Event()
                try:
                    ch = await self._open_channel(pid, sync=False)
                finally:
                    ev.set()
                    self._opening.pop(peer, None)
                if ch is not None:
                    if self.membership.own_signed_advert() is not None:
                        # a redial (we were cut off, e.g. frozen): peers that dropped us hold our
                        # last advert already and would not take it again; hand them a new one
                        await self.membership.publish_advert()
                    await self._sync(ch)
        finally:
            self.membership.joined.set()

    async def _dial(self, peer_id: ID, addrs: list[Any]) -> bool:
        host = self.host
        if peer_id == host.get_id():
            return True
        self.stats["dials"] += 1
        try:
            host.get_network().unblock_peer(peer_id)
        except Exception:
            pass
        try:
            if addrs:
                host.get_peerstore().add_addrs(peer_id, addrs, ADDR_TTL_S)
            with trio.fail_after(DIAL_TIMEOUT_S):
                await host.connect(PeerInfo(peer_id, addrs))
            return True
        except Exception as e:
            self.stats["dial_failures"] += 1
            log.info("dial failed peer_id=%s error=%r", peer_id.to_base58(), e)
            return False

    def on_advert(self, adv: Advert, new: bool) -> None:
        """A membership listener: open a channel to a peer we hear of and have none to."""
        ch = self.channels.get(adv.peer_id)
        if ch is not None and ch.alive:
            return
        if adv.peer_id in self._opening:
            return
        if len(self.channels) >= self.config.node.max_peers:
            return
        self.nursery.start_soon(self._open, adv)

    async def _open(self, adv: Advert) -> None:
        ev = trio.Event()
        self._opening[adv.peer_id] = ev
        try:
            pid = ID.from_base58(adv.peer_id)
            addrs = []
            for a in adv.addrs:
                try:
                    addrs.append(multiaddr.Multiaddr(a))
                except Exception:
                    continue
            if not self._connected(pid):
                if self.membership.peer_id > adv.peer_id:
                    # it may be dialling us this very moment (both learnt of each other from
                    # the same gossip): one connection is enough, let the lower id make it
                    with trio.move_on_after(DIAL_YIELD_S):
                        while not self._connected(pid):
                            await trio.sleep(0.02)
                    if self._connected(pid):
                        self.stats["dials_yielded"] += 1
                if not self._connected(pid) and not await self._dial(pid, addrs):
                    return
            await self._open_channel(pid)
        finally:
            ev.set()
            self._opening.pop(adv.peer_id, None)

    def _connected(self, pid: ID) -> bool:
        try:
            return bool(self.host.get_network().get_connections(pid))
        except Exception:
            return False

    async def _open_channel(self, pid: ID, *, sync: bool = True) -> PeerChannel | None:
        try:
            with trio.fail_after(DIAL_TIMEOUT_S):
                stream = await self.host.new_stream(pid, [REQUEST_PROTOCOL])
        except Exception as e:
            log.info("request stream failed peer_id=%s error=%r", pid.to_base58(), e)
            return None
        peer = pid.to_base58()
        framed = FramedStream(stream, MAX_REQUEST_FRAME, REQUEST_TYPES, on_recv=self.heard_from(peer))
        ch = PeerChannel(
            peer,
            framed,
            ping_interval_s=math.inf,  # the liveness loop below pings (ping())
            stall_timeout_s=math.inf,
            on_rtt=self._on_rtt,
            on_dead=self._on_dead,
        )
        self.channels[ch.peer_id] = ch
        self.stats["channels_opened"] += 1
        self.liveness.track(peer, trio.current_time())
        await self.nursery.start(ch.run)
        if sync:
            self.nursery.start_soon(self._sync, ch)
        return ch

    # ---------------------------------------------------------------- liveness

    def heard(self, peer: str) -> None:
        """Any frame from ``peer`` arrived (gossip calls this)."""
        self.liveness.heard(peer, trio.current_time())

    def heard_from(self, peer: str) -> Any:
        """A callback for any frame from ``peer`` (request streams both ways, gossip)."""
        liveness = self.liveness

        def heard() -> None:
            liveness.heard(peer, trio.current_time())

        return heard

    def _on_rtt(self, peer: str, raw_ms: float) -> None:
        """A PONG: the peer answered (liveness), and an RTT sample (membership's Vivaldi)."""
        self.liveness.answered(peer, trio.current_time())
        self.membership.on_rtt(peer, raw_ms)

    async def liveness_loop(self) -> None:
        """Ping whom liveness says is due; close the channels of peers that stalled."""
        wait = LIVENESS_TICK_S
        while True:
            await trio.sleep(wait)
            now = trio.current_time()
            busy = {p for p, ch in self.channels.items() if ch.in_flight}
            decision = self.liveness.decide(now, busy)
            for peer, reason in decision.stalled:
                self.liveness.forget(peer)
                ch = self.channels.get(peer)
                log.warning("peer stalled peer=%s reason=%s", peer, reason)
                if ch is not None:
                    ch.close(reason)  # its run() ends, and _on_dead drops the peer
                else:
                    self._on_dead(peer, reason)
            for peer in decision.ping:
                ch = self.channels.get(peer)
                if ch is None or not ch.alive:
                    self.liveness.forget(peer)
                    continue
                self.liveness.ping_sent(peer, now)
                self.stats["pings"] += 1
                # a task each: a write to a peer whose TCP window is full can block, and that
                # must not hold up the other peers' pings (the unanswered ping stalls it)
                self.nursery.start_soon(self._ping, ch)
            linked = [p for p, ch in self.channels.items() if ch.alive]
            for peer in self.membership.pulls_due(now, linked):
                self.stats["pulls"] += 1
                self.nursery.start_soon(self._pull, self.channels[peer])
            # sleep until the next thing can fall due: an idle node wakes once a second rather
            # than four times (each wake-up of a trio task costs ~0.1 ms of CPU)
            wait = min(max(self.liveness.next_check(now, busy) - now, LIVENESS_TICK_S),
                       LIVENESS_IDLE_S)

    async def gossip_streams_loop(self) -> None:
        """A bootstrap peer, or any connected peer while no connected peer has one, that has
        had no gossip stream for two checks in a row gets pubsub's registration again
        (``Gossip.reopen_stream``). That is the node cut off from gossip at join; once it
        hears adverts (or syncs) it dials the others, and those connections register their
        streams as usual. Other peers without a stream are left to pubsub's own retries:
        re-opening every one of them kept a starved 40-daemon mesh starved."""
        while True:
            await trio.sleep(BOOTSTRAP_KEEP_S)
            if self.gossip is None:
                continue
            try:
                connected = list(self.host.get_network().connections)
            except Exception:
                continue
            gossip = self.gossip
            without = [pid for pid in connected if not gossip.has_stream(pid)]
            if len(without) < len(connected):  # gossip works: mend the bootstrap peers only
                without = [pid for pid in without if pid in self._bootstrap_ids]
            strikes: dict[str, int] = {}
            for pid in without:
                peer = pid.to_base58()
                n = strikes[peer] = self._no_stream.get(peer, 0) + 1
                # after 2, 4, 8 and 16 checks, then once a minute: an open that keeps failing
                # (a peer too busy to answer) is not hammered
                due = n in (2, 4, 8, 16) or (n > 16 and n % 12 == 0)
                if due and peer not in self._reopening:
                    self._reopening.add(peer)
                    self.nursery.start_soon(self._reopen_gossip, pid, peer)
            self._no_stream = strikes
            self.stats["gossip_streams_missing"] = len(strikes)

    async def _reopen_gossip(self, pid: ID, peer: str) -> None:
        assert self.gossip is not None
        log.info("no gossip stream to a connected peer, opening it again peer=%s", peer)
        try:
            with trio.move_on_after(DIAL_TIMEOUT_S * 3):
                await self.gossip.reopen_stream(pid)
        finally:
            self._reopening.discard(peer)

    async def _ping(self, ch: PeerChannel) -> None:
        try:
            await ch.ping()
        except PeerGoneError as e:
            ch.close(f"ping failed: {e}")

    async def _pull(self, ch: PeerChannel) -> None:
        """Ask a linked peer whose adverts gossip stopped bringing for its advert, signed now
        (the probe's SYNC_REQ ``fresh``); checked and taken like gossip."""
        reply = await ch.sync_reply(DIAL_TIMEOUT_S, None, fresh=True)
        items = reply.get("adverts") or []
        self.stats["pull_bytes_in"] += sum(len(x) for x in items if isinstance(x, bytes))
        if self.membership.accept_probed(ch.peer_id, items, pulled=True):
            self.stats["pulls_answered"] += 1

    async def _sync(self, ch: PeerChannel) -> None:
        """Learn the mesh from a new link at once (a joining node need not wait an advert period)."""
        own = self.membership.own_signed_advert()
        reply = await ch.sync_reply(DIAL_TIMEOUT_S, [own] if own is not None else [])
        self.membership.accept_synced(reply.get("adverts") or [])
        summaries = reply.get("summaries")
        if summaries and self.on_sync_summaries is not None:
            self.on_sync_summaries(summaries)

    def _on_dead(self, peer_id: str, reason: str) -> None:
        if self.channels.get(peer_id) is not None and not self.channels[peer_id].alive:
            del self.channels[peer_id]
            self.liveness.forget(peer_id)
        if "stalled" in reason:
            self.stats["stalls"] += 1
        if self.membership.drop_peer(peer_id):
            log.warning("peer dropped peer_id=%s reason=%s", peer_id, reason)
        if "stalled" in reason:
            # a frozen peer keeps its TCP connection: close it so a thawed peer redials cleanly
            self.nursery.start_soon(self._disconnect, peer_id)

    async def _disconnect(self, peer_id: str) -> None:
        with trio.move_on_after(2):
            try:
                await self.host.disconnect(ID.from_base58(peer_id))
            except Exception:
                pass

    async def channel(self, peer_id: str, addrs: tuple[str, ...] = (), *,
                      sync: bool = True) -> PeerChannel:
        """The live channel to a peer, opening one if needed: to a peer of the table, or (cells)
        to a node a summary named, dialled at ``addrs`` (``sync``: exchange adverts when opened)."""
        ch = self.channels.get(peer_id)
        if ch is not None and ch.alive:
            return ch
        ev = self._opening.get(peer_id)
        if ev is not None:
            with trio.move_on_after(DIAL_TIMEOUT_S):
                await ev.wait()
            ch = self.channels.get(peer_id)
            if ch is not None and ch.alive:
                return ch
        e = self.membership.table.get(peer_id)
        if e is None and not addrs:
            raise PeerGoneError(f"peer {peer_id[-8:]} is not in the peer table")
        name = e.advert.name if e is not None else peer_id[-8:]
        try:
            pid = ID.from_base58(peer_id)
            maddrs = [multiaddr.Multiaddr(a) for a in (e.advert.addrs if e is not None else addrs)]
        except Exception:
            raise PeerGoneError(f"peer {name} has no address we can dial") from None
        if not self._connected(pid) and not await self._dial(pid, maddrs):
            raise PeerGoneError(f"cannot dial peer {name}")
        ch = await self._open_channel(pid, sync=sync)
        if ch is None:
            raise PeerGoneError(f"cannot open a request stream to {name}")
        return ch

    # ---------------------------------------------------------------- connection events

    def notifee(self) -> INotifee:
        return _LinkNotifee(self)

    def on_disconnected(self, peer_id: str) -> None:
        ch = self.channels.get(peer_id)
        if ch is not None:
            ch.close("connection lost")
        if self.membership.drop_peer(peer_id):
            log.info("peer disconnected peer_id=%s", peer_id)

    def statistics(self) -> dict[str, Any]:
        return {**self.stats, "channels": sum(1 for c in self.channels.values() if c.alive),
                "tracked": len(self.liveness)}


class _LinkNotifee(INotifee):
    def __init__(self, links: Links) -> None:
        self.links = links

    async def disconnected(self, network: Any, conn: Any) -> None:
        try:
            pid = conn.muxed_conn.peer_id
            if not network.get_connections(pid):
                self.links.on_disconnected(pid.to_base58())
        except Exception:
            log.debug("disconnect notification failed", exc_info=True)

    async def connected(self, network: Any, conn: Any) -> None:
        pass

    async def opened_stream(self, network: Any, stream: Any) -> None:
        pass

    async def closed_stream(self, network: Any, stream: Any) -> None:
        pass

    async def listen(self, network: Any, multiaddr: Any) -> None:
        pass

    async def listen_close(self, network: Any, multiaddr: Any) -> None:
        pass
