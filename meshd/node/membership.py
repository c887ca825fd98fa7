"""Membership: who is in the mesh, as this node knows it.

The service owns the peer table and this node's own advert: it publishes the advert (every
``advert_interval_s``, jittered, and early on a significant load change), checks every advert
that gossip or a new link's SYNC brings (``meshd.core.advert_check``, a pure validator) and puts
the good ones in the table, hands its adverts to a new link (``signed_adverts``), expires silent
peers, drops peers whose link broke or whose certificate is revoked (``drop_peer``, ``expel``),
and keeps this node's Vivaldi coordinate from the RTTs its links measure (``on_rtt``). The
routing snapshot (``snapshot``) is built from what it holds.

Its dependencies are explicit: the config, the identity, the attestor (revoked serials and the
clock skew), the local runner and the stage server's load (``StageLoad``); at run time the
gossip topics (``GossipPort``) and the addresses to advertise. Whoever reacts to adverts (the
links open a channel to a new peer; revocations re-gossip the list to a newcomer) registers with
``add_listener``.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import trio

from meshd.config import Config
from meshd.core import cells
from meshd.core.advert import MAX_COLLECTIONS, Advert, ModelAdvert, significant_load_change
from meshd.core.advert_check import MALFORMED, REPLAY, AdvertChecker, Rejected, read_claim, seal
from meshd.core.hwsignals import reserve_host_memory
from meshd.core.peertable import PeerTable, Verdict
from meshd.core.snapshot import MeshSnapshot
from meshd.core.vivaldi import Coord, update
from meshd.net.attest import Attestor
from meshd.net.identity import NodeIdentity
from meshd.node.runner import Runner
from meshd.node.view import build_snapshot, coord_of
from meshd.telemetry import Hardware

log = logging.getLogger(__name__)

VALIDATED_CACHE = 2048
SYNC_MAX_ADVERTS = 256  # adverts handed to a new link (fits a request frame with room to spare)
DELAY_SAMPLES = 512
RTT_WINDOW = 4  # ping samples per peer whose minimum is taken as its RTT
ADVERT_JITTER = 0.1  # each advert period is the interval +-10%, so nodes do not publish in step
JOIN_SYNC_WAIT_S = 2.0  # the first advert waits this long at most for the bootstrap SYNC

Listener = Callable[[Advert, bool], None]
"""``listener(advert, new)``: an advert was taken into the table; ``new``: a peer we lacked (of
our own cell: a probed node of another cell is never new)."""


class GossipPort(Protocol):
    """The gossip topics a service uses (``meshd.net.gossip.Gossip``)."""

    def set_validator(self, topic: str, validator: Callable[[str, bytes], bool]) -> None: ...

    async def subscribe(self, topic: str) -> Any: ...

    async def publish(self, topic: str, data: bytes) -> None: ...


class StageSpeed(Protocol):
    @property
    def prefill_ms_per_layer_token(self) -> float: ...

    @property
    def decode_ms_per_layer(self) -> float: ...


class StageLoad(Protocol):
    """What the advert says of the stage server (``meshd.node.stages.StageServer``)."""

    @property
    def sessions(self) -> Mapping[str, object]: ...

    def free_kv_tokens(self, model: str) -> int: ...

    def speed(self, model: str) -> StageSpeed: ...


class Membership:
    def __init__(
        self,
        config: Config,
        identity: NodeIdentity,
        attestor: Attestor,
        runner: Runner,
        stages: StageLoad,
        *,
        rng: random.Random | None = None,
        hardware: Hardware | None = None,
    ) -> None:
        self.config = config
        self.identity = identity
        self.attestor = attestor
        self.runner = runner
        self.stages = stages
        self.rng = rng or random.Random()
        self.hardware = hardware
        self.peer_id = identity.peer_id.to_base58()
        self.node_name = config.node.name or identity.name
        self.labels = dict(identity.certificate.labels)
        self.region = self.labels.get("region", "")
        g = config.gossip
        # cells (docs/gossip-at-scale.md): None when off; adverts of other cells are refused on
        # gossip and SYNC, and enter the table only as a probe's answer (via "probe")
        self.cell_count = cells.cell_count(g.mesh_size, g.cell_size)
        self.cell = self.cell_of(self.peer_id, self.labels)
        self.topic = cells.advert_topic(self.cell)
        self.via: dict[str, str] = {}  # peer id -> "cell" or "probe": how its advert came
        self.probe_ttl_s = 3.0 * g.probe_interval_s
        self.table = PeerTable(self.peer_id, expiry_s=g.advert_interval_s * g.expiry_intervals)
        self.pull_after_s = g.advert_interval_s * g.pull_after_intervals  # 0: never pull
        self._pulled_at: dict[str, float] = {}
        self.checker = AdvertChecker(self.peer_id, identity.ca_public_key,
                                     clock_skew_s=attestor.clock_skew_s)
        self.coord = Coord.origin()
        self.seq = int(time.time() * 1000)
        self.addrs: tuple[str, ...] = ()  # what the advert tells peers to dial (set by run)
        # the retrieval collections held here, for the advert (the node sets its RagService's)
        self.collections: Callable[[], Sequence[str]] = tuple
        self.revoked_peer_ids: set[str] = set()
        # set once a bootstrap peer's SYNC answered (or there is none): the first advert waits
        self.joined = trio.Event()
        self.advert_delays_ms: deque[float] = deque(maxlen=DELAY_SAMPLES)
        self.stats: dict[str, int] = {
            "adverts_published": 0,
            "adverts_accepted": 0,
            "adverts_rejected": 0,
            "adverts_replayed": 0,
            "adverts_timed": 0,
            "adverts_synced": 0,
            "adverts_probed": 0,
            "adverts_pulled": 0,
            "adverts_other_cell": 0,
        }
        self.rejections: dict[str, int] = {}
        self._gossip: GossipPort | None = None
        self._listeners: list[Listener] = []
        self._validated: dict[bytes, Advert] = {}
        self._signed: dict[str, bytes] = {}  # latest accepted signed advert of each peer
        self._dropped_seq: dict[str, int] = {}  # seq of the advert of a peer dropped on link loss
        self._own_signed: bytes | None = None
        self._rtt_samples: dict[str, deque[float]] = {}
        self._hw_map: tuple[Hardware | None, dict[str, Any]] = (None, {})
        self._hw_reserved = 0

    def set_hardware(self, hardware: Hardware) -> None:
        """A new hardware reading (node/hwmon.py): the next advert carries it."""
        self.hardware = hardware

    def _hardware_map(self) -> dict[str, Any]:
        """The reading as adverts carry it, made once per reading and prefix cache reserve
        (each snapshot asks): host memory the prefix caches may still take is not free
        (``hwsignals.reserve_host_memory``)."""
        hw = self.hardware
        if hw is None:
            return {}
        reserved = self.runner.prefix_reserved_bytes()
        if self._hw_map[0] is not hw or self._hw_reserved != reserved:
            self._hw_map = (hw, dict(reserve_host_memory(hw.to_dict(), reserved)))
            self._hw_reserved = reserved
        return self._hw_map[1]

    def add_listener(self, listener: Listener) -> None:
        self._listeners.append(listener)

    async def run(self, gossip: GossipPort, addrs: Sequence[str], *,
                  task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Publish this node's advert (with ``addrs``), take the mesh's, expire silent peers."""
        self._gossip = gossip
        self.addrs = tuple(addrs)
        gossip.set_validator(self.topic, self.validate)
        adverts = await gossip.subscribe(self.topic)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._receive, adverts)
            nursery.start_soon(self._advert_loop)
            nursery.start_soon(self._expiry_loop)
            task_status.started()

    def statistics(self) -> dict[str, Any]:
        """The advert counters, the rejections by reason, and the advert delays."""
        return {**self.stats, "rejections": dict(self.rejections),
                "advert_delay_ms": delay_summary(self.advert_delays_ms, self.stats["adverts_timed"])}

    # ------------------------------------------------------------------ this node's advert

    def local_advert(self) -> Advert:
        runner, stages = self.runner, self.stages
        served = [s for s in runner.models.values() if runner.ready(s.name)]
        models = []
        for s in served:
            speed = stages.speed(s.name)
            batch_max, batch_tps = runner.batch_curve(s.name)
            models.append(
                ModelAdvert(
                    name=s.name,
                    num_layers=s.num_layers,
                    layer_start=s.layer_start,
                    layer_end=s.layer_end,
                    prefill_tps=round(s.prefill_tps, 1),
                    decode_tps=round(s.decode_tps, 1),
                    free_kv_tokens=stages.free_kv_tokens(s.name),
                    hidden_size=int(getattr(s.model, "hidden_size", 0) or 0),
                    prefill_ms_per_layer_token=round(speed.prefill_ms_per_layer_token, 4),
                    decode_ms_per_layer=round(speed.decode_ms_per_layer, 4),
                    context_length=runner.context_length(s.name) or 0,
                    tokenizer=runner.advertised_tokenizer(s.name),
                    tier=s.tier,
                    quality=s.quality,
                    kv_bytes_per_token=kv_bytes_per_layer_token(s.model) * (s.layer_end - s.layer_start),
                    batch_max=batch_max,
                    batch_tps=batch_tps,
                    weight_format=weight_format(s.model),
                    model_id=runner.model_identity(s.name),
                    ttft_ms=round(s.ttft_ms, 1),
                    prefix_sketch=runner.prefix_sketch(s.name),
                )
            )
        prefill = max((s.prefill_tps for s in served), default=0.0)
        decode = max((s.decode_tps for s in served), default=0.0)
        return Advert(
            peer_id=self.peer_id,
            name=self.node_name,
            seq=self.seq,
            ts=time.time(),
            region=self.region,
            labels=self.labels,
            roles=tuple(self.identity.certificate.roles),
            addrs=self.addrs[:8],
            hardware=self._hardware_map(),
            models=tuple(models),
            queue_depth=runner.queue_depth(),
            in_flight=runner.in_flight() + len(stages.sessions),
            max_concurrency=sum(s.max_concurrency for s in served) or 1,
            max_queue=sum(s.max_queue for s in served),
            prefill_tps=round(prefill, 1),
            decode_tps=round(decode, 1),
            cost_per_hour=self.config.node.cost_per_hour,
            service_rate_rps=round(sum(s.service_rate_rps() for s in served if s.whole), 3),
            coord=self.coord.vec,
            coord_height=self.coord.height,
            coord_error=self.coord.error,
            coord_adjustment=self.coord.adjustment,
            collections=tuple(sorted(self.collections()))[:MAX_COLLECTIONS],
        )

    def sign_advert(self) -> bytes:
        """This node's advert with the next sequence number, signed, as gossip carries it."""
        self.seq = max(self.seq + 1, int(time.time() * 1000))
        return seal(self.local_advert(), self.identity.key_pair.private_key.sign,
                    self.identity.certificate_bytes)

    def own_signed_advert(self) -> bytes | None:
        return self._own_signed

    async def publish_advert(self) -> None:
        assert self._gossip is not None
        data = self.sign_advert()
        self._own_signed = data
        try:
            with trio.fail_after(5):
                await self._gossip.publish(self.topic, data)
            self.stats["adverts_published"] += 1
        except Exception as e:
            log.warning("advert publish failed error=%r", e)

    def _load(self) -> tuple[int, int]:
        return self.runner.queue_depth(), self.runner.in_flight() + len(self.stages.sessions)

    async def _advert_loop(self) -> None:
        g = self.config.gossip
        # learn the mesh from the bootstrap peer before the mesh learns of us: everyone dials a
        # newcomer at once, and our SYNC should not queue behind those handshakes
        with trio.move_on_after(JOIN_SYNC_WAIT_S):
            await self.joined.wait()
        last = -1e9
        period = g.advert_interval_s
        published_load: tuple[int, int] = (-1, -1)
        while True:
            now = trio.current_time()
            load = self._load()
            due = now - last >= period
            significant = significant_load_change(published_load, load) and now - last >= g.min_advert_gap_s
            if due or significant:
                await self.publish_advert()
                last = trio.current_time()
                published_load = load
                period = g.advert_interval_s * self.rng.uniform(1 - ADVERT_JITTER, 1 + ADVERT_JITTER)
            wait = max(0.05, min(period - (trio.current_time() - last), period))
            with trio.move_on_after(wait):
                await self.runner.changed.wait()
                # let a burst of changes settle before deciding
                await trio.sleep(g.min_advert_gap_s / 4)

    # ------------------------------------------------------------------ the mesh's adverts

    def reject(self, reason: str) -> bool:
        """Count a rejection (adverts, and revocation lists on their topic) by reason."""
        self.stats["adverts_rejected"] += 1
        self.rejections[reason] = self.rejections.get(reason, 0) + 1
        return False

    def validate(self, author: str, data: bytes) -> bool:
        """Gossip validator: attested author, valid signature, schema, not a replay. Sync.

        The very advert we hold for a live peer already (it came first by SYNC) is accepted
        without being applied again: rejecting it as a replay would stop gossip from forwarding
        it, and the peers behind us would never hear it."""
        if author in self.table.entries and self._signed.get(author) == data:
            return True  # not put in _validated: _receive skips it
        if not self._check(author, data):
            return False
        adv = self._validated.get(bytes(data))
        if adv is not None and not self.same_cell(adv):
            self._validated.pop(bytes(data), None)
            return self.reject("wrong_cell")
        return True

    def _check(self, author: str, data: bytes) -> bool:
        """``AdvertChecker.check``; a good advert is kept in ``_validated`` for ``_apply``."""
        out = self.checker.check(data, author, time.time(), last_seq=self.table.last_seq.get(author, -1),
                                 revoked=self.attestor.revoked)
        if isinstance(out, Rejected):
            if out.reason == MALFORMED:
                log.info("advert rejected author=%s reason=%s", author, out.detail)
            elif out.reason == REPLAY:
                self.stats["adverts_replayed"] += 1
            return self.reject(out.reason)
        if len(self._validated) > VALIDATED_CACHE:
            self._validated.clear()
        self._validated[bytes(data)] = out
        return True

    async def _receive(self, sub: Any) -> None:
        while True:
            msg = await sub.get()
            data = bytes(msg.data)
            adv = self._validated.pop(data, None)
            if adv is None:
                continue  # our own advert, or one that failed validation
            if self._apply(adv, data):
                # publish-to-receipt delay (meaningful where clocks agree: the benchmark's loopback)
                self.advert_delays_ms.append(max(0.0, (time.time() - adv.ts) * 1000.0))
                self.stats["adverts_timed"] += 1

    def _apply(self, adv: Advert, data: bytes, via: str = "cell") -> bool:
        """Put a validated advert in the table; True when it was new information."""
        verdict = self.table.apply(adv, trio.current_time(), time.time())
        if verdict in (Verdict.NEW, Verdict.UPDATED):
            self.stats["adverts_accepted"] += 1
            self.via[adv.peer_id] = via
            if via == "cell":
                self._signed[adv.peer_id] = data
            self._dropped_seq.pop(adv.peer_id, None)
            # a probed node of another cell is no newcomer of ours (no join log, no re-gossip of
            # the revocation list: it has that from the mesh-wide topic)
            new = verdict is Verdict.NEW and via == "cell"
            for listener in self._listeners:
                listener(adv, new)
            if new:
                log.info("peer joined name=%s peer_id=%s", adv.name, adv.peer_id)
            return True
        if verdict in (Verdict.REPLAY, Verdict.STALE):
            self.stats["adverts_replayed"] += 1
            self.reject(verdict.value)
        return False

    # ------------------------------------------------------------------ sync with a new link

    def signed_adverts(self) -> list[bytes]:
        """The signed adverts this node holds (its own first), for a new link's SYNC."""
        live = {e.advert.peer_id for e in self.table.live() if self.via.get(e.advert.peer_id) != "probe"}
        out = [self._own_signed] if self._own_signed is not None else []
        out += [d for pid, d in sorted(self._signed.items()) if pid in live]
        return out[:SYNC_MAX_ADVERTS]

    def accept_synced(self, items: list[Any]) -> int:
        """Check adverts a peer handed over on a new link exactly as gossip is checked, then
        apply them, so a joining node knows the mesh at once instead of after one period."""
        applied = 0
        for data in items[:SYNC_MAX_ADVERTS]:
            claimed = read_claim(data)
            if isinstance(claimed, Rejected):
                self.reject(claimed.reason)
                continue
            author = claimed.peer_id
            if author == self.peer_id or author in self.revoked_peer_ids:
                continue
            last = self.table.last_seq.get(author, -1)
            readmit = last == claimed.seq and self._dropped_seq.get(author) == claimed.seq
            if last >= claimed.seq and not readmit:
                continue  # nothing new: not a replay attack, just what we already know
            if readmit:
                # we dropped this peer when our link to it broke (we froze, or it did), and a live
                # peer vouches for its latest advert: take that advert back, once
                self.table.last_seq[author] = claimed.seq - 1
            adv = self._validated.pop(data, None) if self._check(author, data) else None
            if adv is not None and not self.same_cell(adv):
                self.stats["adverts_other_cell"] += 1  # a node of another cell: not ours to hold
                adv = None
            if adv is not None and self._apply(adv, data):
                applied += 1
            elif readmit:
                self.table.last_seq[author] = claimed.seq
        self.stats["adverts_synced"] += applied
        return applied

    # ------------------------------------------------------------------ cells and probes

    def cell_of(self, peer_id: str, labels: Mapping[str, str]) -> str | None:
        """The cell of a node with this peer id and these certified labels (None: cells off)."""
        g = self.config.gossip
        return cells.cell_of(g.cells, peer_id, labels, label_key=g.cell_label, count=self.cell_count)

    def same_cell(self, adv: Advert) -> bool:
        return self.cell is None or self.cell_of(adv.peer_id, adv.labels) == self.cell

    def cell_members(self) -> list[str]:
        """The live members of this node's cell that it knows of (itself left out)."""
        return [e.advert.peer_id for e in self.table.live() if self.via.get(e.advert.peer_id) != "probe"]

    def fresh_signed_advert(self) -> bytes:
        """A probe's answer: this node's advert signed now, with its load now."""
        data = self.sign_advert()
        self._own_signed = data
        return data

    def accept_probed(self, peer_id: str, items: list[Any], *, pulled: bool = False) -> bool:
        """A probe's answer from ``peer_id``: its own fresh advert, checked like gossip (the
        author must be the peer asked). Taken into the table as a candidate of this node's
        decisions until ``probe_ttl_s`` old; True if it was. ``pulled``: the answer to a pull
        (``pulls_due``), taken only from a member of this node's cell."""
        for data in items[:1]:
            claimed = read_claim(data)
            if isinstance(claimed, Rejected) or claimed.peer_id != peer_id or peer_id in self.revoked_peer_ids:
                self.reject("bad_probe")
                return False
            adv = self._validated.pop(data, None) if self._check(peer_id, data) else None
            if adv is None or (pulled and not self.same_cell(adv)):
                return False
            via = "cell" if self.same_cell(adv) else "probe"
            if self._apply(adv, data, via):
                self.stats["adverts_pulled" if pulled else "adverts_probed"] += 1
                return True
        return False

    def pulls_due(self, now: float, linked: Sequence[str]) -> list[str]:
        """The linked peers to ask for their advert now: members of this node's cell whose
        adverts gossip has not brought for ``pull_after_s`` (or that the table lost while the
        link stayed up), each at most once per ``pull_after_s``.

        Gossip alone is not enough to keep a table: gossipsub can leave a node with an empty
        mesh for a whole prune back-off (60 s in py-libp2p), and then the node hears nobody's
        adverts and nobody hears its own, while every link is up (seen on the loaded testnet:
        docs/routing.md). A pull over the link is one small round trip, and when gossip works
        it never happens: adverts arrive every ``advert_interval_s``."""
        if self.pull_after_s <= 0:
            return []
        due = []
        for pid in linked:
            e = self.table.get(pid)
            if e is not None:
                if self.via.get(pid) != "cell" or now - e.heard_at < self.pull_after_s:
                    continue
            else:
                cert = self.attestor.certificate_of(pid)
                if (cert is None or pid in self.revoked_peer_ids
                        or self.cell_of(pid, dict(cert.labels)) != self.cell):
                    continue
            if now - self._pulled_at.get(pid, -math.inf) < self.pull_after_s:
                continue
            self._pulled_at[pid] = now
            due.append(pid)
        if len(self._pulled_at) > 4 * self.config.node.max_peers:  # forget departed peers
            keep = set(linked)
            self._pulled_at = {p: t for p, t in self._pulled_at.items() if p in keep}
        return due

    def _expire_probed(self, now: float) -> None:
        for pid, via in list(self.via.items()):
            e = self.table.get(pid)
            if e is None:
                del self.via[pid]
            elif via == "probe" and now - e.heard_at > self.probe_ttl_s:
                self.table.drop(pid)
                del self.via[pid]

    # ------------------------------------------------------------------ leaving

    def drop_peer(self, peer_id: str) -> bool:
        """Our link to ``peer_id`` broke (lost connection, stall): stop routing to it. Its latest
        advert may come back through a SYNC (``accept_synced``) once links are up again."""
        e = self.table.get(peer_id)
        if e is not None:
            self._dropped_seq[peer_id] = e.advert.seq
            if len(self._dropped_seq) > 4 * self.config.node.max_peers:
                self._dropped_seq = {p: q for p, q in self._dropped_seq.items() if p == peer_id}
        return self.table.drop(peer_id)

    def expel(self, gone: Sequence[str]) -> None:
        """A revocation list took effect: drop the disconnected peers ``gone`` and every peer
        (connected or heard through gossip) whose serial is now revoked; never take ``gone``
        back from a SYNC."""
        revoked = self.attestor.revoked
        for pid in list(self.table.entries):
            cert = self.attestor.certificate_of(pid)
            if pid in gone or (cert is not None and cert.serial in revoked):
                self.table.drop(pid)
        self.revoked_peer_ids.update(gone)

    async def _expiry_loop(self) -> None:
        while True:
            await trio.sleep(min(1.0, self.config.gossip.advert_interval_s / 2))
            now = trio.current_time()
            for pid in self.table.expire(now):
                if self.via.get(pid) != "probe":
                    log.info("peer expired peer_id=%s", pid)
            self._expire_probed(now)

    # ------------------------------------------------------------------ RTT / Vivaldi

    def on_rtt(self, peer_id: str, raw_ms: float) -> None:
        """A ping's round trip. A busy node (ours or the peer's) only ever adds delay to a
        sample, so the network's RTT is the floor of the recent ones: the minimum of the last
        ``RTT_WINDOW`` (about 40 s of pings at the default ``ping_interval_s``) feeds both the
        table and Vivaldi. Without it, CPU saturation on a small box drags every coordinate away
        (measured on the testnet)."""
        window = self._rtt_samples.get(peer_id)
        if window is None:
            if len(self._rtt_samples) > 4 * self.config.node.max_peers:  # forget departed peers
                self._rtt_samples = {p: w for p, w in self._rtt_samples.items() if p in self.table.entries}
            window = self._rtt_samples[peer_id] = deque(maxlen=RTT_WINDOW)
        window.append(raw_ms)
        rtt_ms = min(window)
        self.table.record_rtt(peer_id, rtt_ms, trio.current_time())
        e = self.table.get(peer_id)
        remote = coord_of(e.advert) if e is not None else None
        if remote is not None and len(remote.vec) == len(self.coord.vec):
            self.coord = update(self.coord, remote, rtt_ms, rng=self.rng)

    def snapshot(self) -> MeshSnapshot:
        """The routing snapshot: this node and the live peers, now."""
        return build_snapshot(self.local_advert(), self.table.live(), self.coord, trio.current_time())


def weight_format(model: object) -> str:
    """How a served model's weights are stored, for the advert: its manifest's dtype (an
    engine model's ``weight_format``, or the manifest of what it holds), or "upstream" for a
    model an upstream server runs ("" when unknown)."""
    fmt = getattr(model, "weight_format", None)
    if isinstance(fmt, str):
        return fmt
    manifest = getattr(model, "manifest", None) or getattr(getattr(model, "model", None), "manifest", None)
    if manifest is not None:
        return str(manifest.dtype)
    return "upstream" if getattr(model, "base_url", None) else ""


def kv_bytes_per_layer_token(model: object) -> int:
    """KV cache bytes one token takes in one layer of ``model`` (0: the model does not say)."""
    v = getattr(model, "kv_bytes_per_layer_token", 0)
    return v if isinstance(v, int) and v > 0 else 0


def delay_summary(samples: Any, total: int) -> dict[str, Any]:
    """Publish-to-receipt delay of recent adverts heard by gossip: p50/p99 over the recent
    samples, the samples, and ``n`` = how many were ever taken (the recent ones are a ring)."""
    xs = sorted(samples)
    if not xs:
        return {"n": total, "p50": None, "p99": None, "recent": []}

    def pct(q: float) -> float:
        return round(float(xs[min(len(xs) - 1, int(q * len(xs)))]), 3)

    return {"n": total, "p50": pct(0.5), "p99": pct(0.99), "recent": [round(x, 3) for x in samples]}
