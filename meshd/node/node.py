"""The meshd node: owns the libp2p host and gossip, builds the services and wires them together.
``Node.run`` is the root of the daemon's nursery tree.

    membership    adverts, peer table, sync, expiry, RTT/Vivaldi      (meshd.node.membership)
    revocations   the CA's revocation list in force, and its gossip   (meshd.node.revocations)
    links         dials, one request channel per peer, liveness          (meshd.node.links)
    entry         what this node does with a client's request              (meshd.node.entry)
    server        REQs from peers to the local runner                      (meshd.node.serve)
    stage_server, stage_links    pipeline stages          (meshd.node.stages, .stagelinks)
    placer        layers = "auto"                                      (meshd.node.autoplace)
    tokenizers    tokenizers of models served elsewhere (edge tokenization) (meshd.node.tokenizers)
    edge_cache    the semantic cache                                   (meshd.node.edge_cache)
    rag           retrieval collections, here and on peers                    (meshd.node.rag)
    control       the control socket's answers                           (meshd.node.control)
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import multiaddr
import trio

from meshd.config import Config
from meshd.control.audit import audit_requests
from meshd.control.server import ControlServer
from meshd.core.messages import REQUEST_PROTOCOL, REQUEST_TYPES, STAGE_PROTOCOL
from meshd.core.routing import round_robin_offset
from meshd.core.snapshot import Policy
from meshd.core.wire import MAX_REQUEST_FRAME
from meshd.net.attest import Attestor, disconnect_all, make_host
from meshd.net.framed import FramedStream
from meshd.net.gossip import Gossip, open_gossip
from meshd.net.identity import NodeIdentity
from meshd.node.autoplace import AutoPlacer
from meshd.node.cells import Cells
from meshd.node.control import ControlService
from meshd.node.edge_cache import EdgeCache
from meshd.node.entry import EntryChain, EntryState
from meshd.node.hwmon import HardwareMonitor
from meshd.node.links import Links
from meshd.node.membership import Membership
from meshd.node.rag import RagService
from meshd.node.revocations import Revocations
from meshd.node.runner import Runner
from meshd.node.serve import RequestServer
from meshd.node.stagelinks import StageLinks
from meshd.node.stages import StageServer
from meshd.node.status import node_status, peers_listing
from meshd.node.tiering import Tiering
from meshd.node.tokenizers import TokenizerService
from meshd.paths import control_socket_path
from meshd.store.async_store import AsyncStore
from meshd.telemetry import Hardware

log = logging.getLogger(__name__)


class Node:
    def __init__(
        self,
        config: Config,
        identity: NodeIdentity,
        runner: Runner,
        *,
        store: AsyncStore | None = None,
        hardware: Hardware | None = None,
        revocation: bytes | None = None,
        monitor: HardwareMonitor | None = None,
    ) -> None:
        self.config = config
        self.identity = identity
        self.runner = runner
        self.store = store
        self.monitor = monitor  # re-reads the hardware each advert interval (node/hwmon.py)
        if hardware is None and monitor is not None:
            hardware = monitor.first
        self.peer_id = identity.peer_id.to_base58()
        self.node_name = config.node.name or identity.name
        self.started_at = time.time()
        self.rng = random.Random()
        self.policy = policy_of(config)
        self.attestor = Attestor(identity.ca_public_key)
        self.stage_server = StageServer(runner, self.node_name)  # pipelines: docs/pipeline.md
        self.membership = Membership(config, identity, self.attestor, runner, self.stage_server,
                                     rng=self.rng, hardware=hardware)
        if monitor is not None:
            monitor.on_reading = self.membership.set_hardware
        self.revocations = Revocations(self.attestor, self.membership, crl=revocation,
                                       data_dir=config.path(config.node.data_dir))
        self.edge_cache = EdgeCache(config)  # the semantic cache (docs/cache.md)
        self.rag = RagService(self, self.edge_cache)  # retrieval collections (docs/rag.md)
        self.membership.collections = lambda: self.rag.names
        # cells (docs/gossip-at-scale.md): summaries, bridges and probes; None when cells are off
        self.cells = Cells(config, identity, self.membership, rng=self.rng) \
            if self.membership.cell is not None else None
        self.server = RequestServer(runner, self.node_name, max_hops=config.routing.max_hops,
                                    adverts=self.membership.signed_adverts,
                                    accept_adverts=self.membership.accept_synced,
                                    retrieve=self.rag.serve,
                                    # probes (cells) and pulls (gossip fell silent)
                                    fresh_advert=self.membership.fresh_signed_advert,
                                    summaries=self.cells.signed_summaries if self.cells is not None else None)
        self.stage_links = StageLinks(self, self.stage_server, self.membership.table)
        self.stage_server.links = self.stage_links
        self.placer = AutoPlacer(config, runner, self.membership, self.stage_server)
        self.tokenizers = TokenizerService(self)  # edge tokenization: docs/edge-tokenization.md
        self.tiering = Tiering(config, self.edge_cache)  # model = "auto" (docs/tiers.md)
        # what this node does with a request a client gave it, and what it keeps across them; a
        # round-robin counter that starts where this node's identity says, so independent entry
        # nodes do not walk in step
        self.entry_state = EntryState(round_robin_offset(self.peer_id, config.routing.strategy))
        self.entry = EntryChain(self)
        self.control = ControlService(self.entry, self.revocations, self.edge_cache,
                                      node_name=self.node_name, peer_id=self.peer_id,
                                      status=self.status, peers=self.peers_listing, store=store)
        self.host: Any = None
        self.gossip: Gossip | None = None
        self.links: Links | None = None
        self.ready = trio.Event()
        # the entry path's counters (membership counts adverts: Membership.statistics)
        self.stats: dict[str, int] = {
            "requests_submitted": 0,
            "requests_failed": 0,
            "requests_local": 0,
            "requests_forwarded": 0,
            "handler_errors": 0,
        }
        self.addrs: list[str] = []
        self.api_url: str | None = None  # the HTTP API's base URL once it listens (run_daemon)

    @property
    def hardware(self) -> Hardware | None:
        """The latest hardware reading (what the next advert carries)."""
        return self.membership.hardware

    def socket_path(self) -> Path:
        return control_socket_path(self.config)

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        cfg = self.config
        listen = [multiaddr.Multiaddr(a) for a in cfg.node.listen]
        # the daemon redials on its own schedule; a peer that failed attestation fails again
        self.host = make_host(self.identity, self.attestor, dial_retries=0)
        async with self.host.run(listen):
            self.addrs = [str(a) for a in cfg.node.announce] or [
                str(a) for a in self.host.get_addrs()
            ]
            async with open_gossip(
                self.host,
                degree=cfg.gossip.degree,
                heartbeat_interval_s=cfg.gossip.heartbeat_interval_s,
                ihave_window=cfg.gossip.ihave_window,
            ) as gossip:
                self.gossip = gossip
                self.links = links = Links(self.host, cfg, self.membership, rng=self.rng)
                links.gossip = gossip
                self.membership.add_listener(links.on_advert)
                self.membership.add_listener(self.revocations.on_advert)
                async with trio.open_nursery() as nursery:
                    await nursery.start(links.run)
                    await nursery.start(self.membership.run, gossip, self.addrs)
                    await nursery.start(self.revocations.run, self.host, gossip)
                    if self.cells is not None:
                        await nursery.start(self.cells.run, gossip, links)
                    self.host.set_stream_handler(REQUEST_PROTOCOL, self._guarded(self._on_request_stream))
                    self.host.get_network().register_notifee(links.notifee())
                    gossip.on_heard = links.heard
                    await nursery.start(ControlServer(self.socket_path(), self.control,
                                                      extra=audit_requests(self.store)).run)
                    await nursery.start(self.runner.run)  # batch schedulers of local models
                    await nursery.start(self.stage_server.run)
                    await nursery.start(self.stage_links.run)
                    await nursery.start(self.placer.run)
                    await nursery.start(self.edge_cache.run)
                    await nursery.start(self.rag.run)
                    await nursery.start(self.tokenizers.run)
                    if self.monitor is not None:
                        await nursery.start(self.monitor.run)
                    self.host.set_stream_handler(STAGE_PROTOCOL, self._guarded(self.stage_links.on_stream))
                    links.join()
                    self.ready.set()
                    log.info("node ready name=%s peer_id=%s addrs=%s", self.node_name, self.peer_id,
                             ",".join(self.addrs))
                    task_status.started()
                    try:
                        await trio.sleep_forever()
                    finally:
                        # close links cleanly so peers drop us at once (and no socket is left
                        # to the garbage collector by the library's own shutdown)
                        with trio.CancelScope(shield=True):
                            await disconnect_all(self.host, timeout_s=2.0)

    def _guarded(self, handler: Callable[[Any], Awaitable[None]]) -> Callable[[Any], Awaitable[None]]:
        """Any exception escaping a libp2p stream handler kills the host: contain it here."""

        async def guarded(stream: Any) -> None:
            try:
                await handler(stream)
            except Exception:
                self.stats["handler_errors"] += 1
                log.exception("stream handler failed")
                with trio.move_on_after(1):
                    try:
                        await stream.reset()
                    except Exception:
                        pass

        return guarded

    async def _on_request_stream(self, stream: Any) -> None:
        peer = stream.muxed_conn.peer_id.to_base58()
        # the peer's pings and requests on it prove the peer alive; a peer that sends nothing at
        # all (a live one pings every ping_interval_s) loses the stream instead of holding it
        framed = FramedStream(stream, MAX_REQUEST_FRAME, REQUEST_TYPES,
                              on_recv=self.links.heard_from(peer) if self.links is not None else None,
                              idle_timeout_s=self.config.gossip.stream_idle_timeout_s)
        await self.server.serve_stream(framed, peer)

    # ------------------------------------------------------------------ what clients read

    def status(self) -> dict[str, Any]:
        return node_status(self)

    def peers_listing(self) -> list[dict[str, Any]]:
        rows = peers_listing(self.membership, trio.current_time())
        if self.cells is not None:
            rows += self.cells.summary_peers()
        return rows

    def ready_state(self) -> tuple[bool, str]:
        """Ready to take requests: running, and holding a local model or a peer to forward to."""
        if not self.ready.is_set():
            return False, "starting"
        if self.runner.models or len(self.membership.table):
            return True, "ready"
        return False, "no local model and no attested peer yet"


def policy_of(config: Config) -> Policy:
    """The routing policy the config sets."""
    r = config.routing
    return Policy(
        strategy=r.strategy,
        lwsq_alpha=r.lwsq_alpha,
        lwsq_beta=r.lwsq_beta,
        sample_d=r.sample_d,
        model_allow=frozenset(r.model_allow),
        client_quota=dict(r.quotas),
        max_hops=r.max_hops,
        wait_bound_attempts=r.wait_bound_attempts,
        wait_bound_min_ms=r.wait_bound_min_ms,
        argmin_below_occupancy=r.argmin_below_occupancy,
        energy_weight=r.energy_weight,
    )
