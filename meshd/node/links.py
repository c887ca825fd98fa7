"""Links to peers: dialling, one long-lived request channel per peer, liveness.

Every peer heard in an advert gets a direct connection and a request channel (up to
``max_peers``), so forwarding never pays a dial or a stream open, and the channel's pings give
RTT samples (for Vivaldi) and detect a frozen peer. A lost connection or a stalled channel
drops the peer from the table at once; its next advert brings it back and it is redialled
(after clearing py-libp2p's 60 s dial block).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import multiaddr
import trio
from libp2p.abc import INotifee
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import info_from_p2p_addr

from meshd.core.advert import Advert
from meshd.core.messages import REQUEST_PROTOCOL, REQUEST_TYPES
from meshd.core.wire import MAX_REQUEST_FRAME
from meshd.errors import PeerGoneError
from meshd.net.channel import PeerChannel
from meshd.net.framed import FramedStream

if TYPE_CHECKING:
    from meshd.node.node import Node

log = logging.getLogger(__name__)

DIAL_TIMEOUT_S = 5.0
BOOTSTRAP_RETRY_S = 2.0
BOOTSTRAP_KEEP_S = 5.0  # how often a connected node checks its bootstrap links are still up
ADDR_TTL_S = 600


class Links:
    def __init__(self, node: Node, nursery: trio.Nursery) -> None:
        self.node = node
        self.nursery = nursery
        self.channels: dict[str, PeerChannel] = {}
        self._opening: dict[str, trio.Event] = {}
        self._revocation_gossip_pending = False
        self.stats = {"dials": 0, "dial_failures": 0, "channels_opened": 0, "stalls": 0}

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
        while infos:
            pending = False
            for info in infos:
                if info.peer_id.to_base58() in self.node.revoked_peer_ids:
                    continue
                if not self._connected(info.peer_id) and not await self._dial(info.peer_id, list(info.addrs)):
                    pending = True
            await trio.sleep(BOOTSTRAP_RETRY_S if pending else BOOTSTRAP_KEEP_S)

    async def _dial(self, peer_id: ID, addrs: list[Any]) -> bool:
        host = self.node.host
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
                from libp2p.peer.peerinfo import PeerInfo

                await host.connect(PeerInfo(peer_id, addrs))
            return True
        except Exception as e:
            self.stats["dial_failures"] += 1
            log.info("dial failed peer_id=%s error=%r", peer_id.to_base58(), e)
            return False

    def on_advert(self, adv: Advert, *, new: bool) -> None:
        ch = self.channels.get(adv.peer_id)
        if ch is not None and ch.alive:
            return
        if adv.peer_id in self._opening:
            return
        if len(self.channels) >= self.node.config.node.max_peers:
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
            if not self._connected(pid) and not await self._dial(pid, addrs):
                return
            await self._open_channel(pid)
        finally:
            ev.set()
            self._opening.pop(adv.peer_id, None)

    def _connected(self, pid: ID) -> bool:
        try:
            return bool(self.node.host.get_network().get_connections(pid))
        except Exception:
            return False

    async def _open_channel(self, pid: ID) -> PeerChannel | None:
        g = self.node.config.gossip
        try:
            with trio.fail_after(DIAL_TIMEOUT_S):
                stream = await self.node.host.new_stream(pid, [REQUEST_PROTOCOL])
        except Exception as e:
            log.info("request stream failed peer_id=%s error=%r", pid.to_base58(), e)
            return None
        framed = FramedStream(stream, MAX_REQUEST_FRAME, REQUEST_TYPES)
        ch = PeerChannel(
            pid.to_base58(),
            framed,
            ping_interval_s=g.ping_interval_s,
            stall_timeout_s=g.stall_timeout_s,
            on_rtt=self.node.on_rtt,
            on_dead=self._on_dead,
        )
        self.channels[ch.peer_id] = ch
        self.stats["channels_opened"] += 1
        await self.nursery.start(ch.run)
        self.nursery.start_soon(self._sync, ch)
        return ch

    async def _sync(self, ch: PeerChannel) -> None:
        """Learn the mesh from a new link at once (a joining node need not wait an advert period)."""
        own = self.node.own_signed_advert()
        items = await ch.sync(DIAL_TIMEOUT_S, [own] if own is not None else [])
        self.node.accept_synced(items)

    def _on_dead(self, peer_id: str, reason: str) -> None:
        if self.channels.get(peer_id) is not None and not self.channels[peer_id].alive:
            del self.channels[peer_id]
        if "stalled" in reason:
            self.stats["stalls"] += 1
        if self.node.table.drop(peer_id):
            log.warning("peer dropped peer_id=%s reason=%s", peer_id, reason)
        if "stalled" in reason:
            # a frozen peer keeps its TCP connection: close it so a thawed peer redials cleanly
            self.nursery.start_soon(self._disconnect, peer_id)

    async def _disconnect(self, peer_id: str) -> None:
        with trio.move_on_after(2):
            try:
                await self.node.host.disconnect(ID.from_base58(peer_id))
            except Exception:
                pass

    async def channel(self, peer_id: str) -> PeerChannel:
        """The live channel to a peer, opening one if needed."""
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
        e = self.node.table.get(peer_id)
        if e is None:
            raise PeerGoneError(f"peer {peer_id[-8:]} is not in the peer table")
        pid = ID.from_base58(peer_id)
        if not self._connected(pid):
            addrs = [multiaddr.Multiaddr(a) for a in e.advert.addrs]
            if not await self._dial(pid, addrs):
                raise PeerGoneError(f"cannot dial peer {e.advert.name}")
        ch = await self._open_channel(pid)
        if ch is None:
            raise PeerGoneError(f"cannot open a request stream to {e.advert.name}")
        return ch

    # ---------------------------------------------------------------- revocation spread

    def schedule_revocation_gossip(self) -> None:
        if self._revocation_gossip_pending:
            return
        self._revocation_gossip_pending = True
        self.nursery.start_soon(self._gossip_revocation)

    async def _gossip_revocation(self) -> None:
        from meshd.core.messages import REVOCATION_TOPIC, MessageType
        from meshd.core.wire import encode_message

        await trio.sleep(1.0)  # batch joins; also lets the new peer's mesh form
        self._revocation_gossip_pending = False
        crl = self.node.revocation_bytes
        if crl is None or self.node.gossip is None:
            return
        try:
            await self.node.gossip.publish(
                REVOCATION_TOPIC, encode_message(MessageType.REVOCATION, {"crl": crl})
            )
        except Exception as e:
            log.info("revocation gossip failed error=%r", e)

    # ---------------------------------------------------------------- connection events

    def notifee(self) -> INotifee:
        return _LinkNotifee(self)

    def on_disconnected(self, peer_id: str) -> None:
        ch = self.channels.get(peer_id)
        if ch is not None:
            ch.close("connection lost")
        if self.node.table.drop(peer_id):
            log.info("peer disconnected peer_id=%s", peer_id)

    def statistics(self) -> dict[str, Any]:
        return {**self.stats, "channels": sum(1 for c in self.channels.values() if c.alive)}


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
