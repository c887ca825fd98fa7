"""The meshd node: owns the libp2p host, gossip, the peer table, links to peers, the local
runner and the control socket, and wires them together. ``Node.run`` is the root of the
daemon's nursery tree.
"""

from __future__ import annotations

import logging
import random
import time
from collections import deque
from pathlib import Path
from typing import Any

import multiaddr
import trio
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from meshd.config import Config
from meshd.control.audit import audit_requests
from meshd.control.server import ControlServer
from meshd.core.advert import (
    Advert,
    ModelAdvert,
    decode_advert,
    significant_load_change,
    signing_payload,
)
from meshd.core.cert import Certificate, check_certificate, verify_signature
from meshd.core.messages import (
    ADVERT_TOPIC,
    REQUEST_PROTOCOL,
    REQUEST_TYPES,
    REVOCATION_TOPIC,
    STAGE_PROTOCOL,
    MessageType,
)
from meshd.core.peertable import PeerTable, Verdict
from meshd.core.routing import round_robin_offset
from meshd.core.snapshot import Policy
from meshd.core.vivaldi import Coord, update
from meshd.core.wire import MAX_ADVERT_BYTES, MAX_REQUEST_FRAME, decode_message, encode_message
from meshd.errors import MeshdError, ProtocolError
from meshd.net.attest import Attestor, apply_revocation, disconnect_all, make_host
from meshd.net.framed import FramedStream
from meshd.net.gossip import Gossip, open_gossip
from meshd.net.identity import NodeIdentity
from meshd.node.autoplace import AutoPlacer
from meshd.node.control import ControlService
from meshd.node.edge_cache import EdgeCache
from meshd.node.entry import EntryChain
from meshd.node.links import Links
from meshd.node.runner import Runner
from meshd.node.serve import RequestServer
from meshd.node.stagelinks import StageLinks
from meshd.node.stages import StageServer
from meshd.node.status import node_status, peers_listing
from meshd.node.tokenizers import TokenizerService
from meshd.node.view import build_snapshot, coord_of
from meshd.paths import control_socket_path

log = logging.getLogger(__name__)

VALIDATED_CACHE = 2048
CERT_MEMO = 1024  # certificates whose CA signature we checked (a peer's cert rides every advert)
SYNC_MAX_ADVERTS = 256  # adverts handed to a new link (fits a request frame with room to spare)
DELAY_SAMPLES = 512
RTT_WINDOW = 4  # ping samples per peer whose minimum is taken as its RTT
ADVERT_JITTER = 0.1  # each advert period is the interval +-10%, so nodes do not publish in step
JOIN_SYNC_WAIT_S = 2.0  # the first advert waits this long at most for the bootstrap SYNC


class Node:
    def __init__(
        self,
        config: Config,
        identity: NodeIdentity,
        runner: Runner,
        *,
        store: Any = None,
        hardware: Any = None,
        revocation: bytes | None = None,
    ) -> None:
        self.config = config
        self.identity = identity
        self.runner = runner
        self.store = store
        self.hardware = hardware
        self.peer_id = identity.peer_id.to_base58()
        self.node_name = config.node.name or identity.name
        self.labels = dict(identity.certificate.labels)
        self.region = self.labels.get("region", "")
        g = config.gossip
        self.table = PeerTable(self.peer_id, expiry_s=g.advert_interval_s * g.expiry_intervals)
        self.attestor = Attestor(identity.ca_public_key)
        self.revocation_bytes = revocation
        if revocation is not None:
            self.attestor.offer_revocation_list(revocation)
        self.coord = Coord.origin()
        self.seq = int(time.time() * 1000)
        self.started_at = time.time()
        self.started_mono = trio.current_time() if _in_trio() else 0.0
        self.rng = random.Random()
        self.policy = Policy(
            strategy=config.routing.strategy,
            lwsq_alpha=config.routing.lwsq_alpha,
            lwsq_beta=config.routing.lwsq_beta,
            sample_d=config.routing.sample_d,
            model_allow=frozenset(config.routing.model_allow),
            client_quota=dict(config.routing.quotas),
            max_hops=config.routing.max_hops,
            wait_bound_attempts=config.routing.wait_bound_attempts,
            wait_bound_min_ms=config.routing.wait_bound_min_ms,
        )
        self.server = RequestServer(runner, self.node_name, max_hops=config.routing.max_hops,
                                    adverts=self.signed_adverts, accept_adverts=self.accept_synced)
        self.stage_server = StageServer(runner, self.node_name)  # pipelines: docs/pipeline.md
        self.stage_links = StageLinks(self, self.stage_server)
        self.stage_server.links = self.stage_links
        self.placer = AutoPlacer(self)  # layers = "auto"
        self.tokenizers = TokenizerService(self)  # edge tokenization: docs/edge-tokenization.md
        # what this node does with a request a client gave it; a round-robin counter that starts
        # where this node's identity says, so independent entry nodes do not walk in step
        self.edge_cache = EdgeCache(config)  # the semantic cache (docs/cache.md)
        self.entry = EntryChain(self, rr_offset=round_robin_offset(self.peer_id, config.routing.strategy),
                                cache=self.edge_cache)
        self.control = ControlService(self)
        self.host: Any = None
        self.gossip: Gossip | None = None
        self.links: Links | None = None
        self._validated: dict[bytes, Advert] = {}
        self._cert_memo: dict[bytes, Certificate] = {}
        self._signed: dict[str, bytes] = {}  # latest accepted signed advert of each peer
        self._dropped_seq: dict[str, int] = {}  # seq of the advert of a peer dropped on link loss
        self._own_signed: bytes | None = None
        self.advert_delays_ms: deque[float] = deque(maxlen=DELAY_SAMPLES)
        self._rtt_samples: dict[str, deque[float]] = {}
        self.ready = trio.Event()
        self.stats: dict[str, int] = {
            "adverts_published": 0,
            "adverts_accepted": 0,
            "adverts_rejected": 0,
            "adverts_replayed": 0,
            "adverts_timed": 0,
            "adverts_synced": 0,
            "requests_submitted": 0,
            "requests_failed": 0,
            "requests_local": 0,
            "requests_forwarded": 0,
            "handler_errors": 0,
        }
        self.rejections: dict[str, int] = {}
        self.addrs: list[str] = []
        self.revoked_peer_ids: set[str] = set()

    # ------------------------------------------------------------------ lifecycle

    def socket_path(self) -> Path:
        return control_socket_path(self.config)

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        cfg = self.config
        self.started_mono = trio.current_time()
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
            ) as gossip:
                self.gossip = gossip
                gossip.set_validator(ADVERT_TOPIC, self._validate_advert)
                gossip.set_validator(REVOCATION_TOPIC, self._validate_revocation)
                adverts = await gossip.subscribe(ADVERT_TOPIC)
                revocations = await gossip.subscribe(REVOCATION_TOPIC)
                self.host.set_stream_handler(REQUEST_PROTOCOL, self._guarded(self._on_request_stream))
                async with trio.open_nursery() as nursery:
                    self.links = Links(self, nursery)
                    self.host.get_network().register_notifee(self.links.notifee())
                    gossip.on_heard = self.links.heard
                    await nursery.start(ControlServer(self.socket_path(), self.control,
                                                      extra=audit_requests(self.store)).run)
                    await nursery.start(self.stage_server.run)
                    await nursery.start(self.stage_links.run)
                    await nursery.start(self.placer.run)
                    await nursery.start(self.edge_cache.run)
                    await nursery.start(self.tokenizers.run)
                    self.host.set_stream_handler(STAGE_PROTOCOL, self._guarded(self.stage_links.on_stream))
                    nursery.start_soon(self._receive_adverts, adverts)
                    nursery.start_soon(self._receive_revocations, revocations)
                    nursery.start_soon(self._advert_loop)
                    nursery.start_soon(self._expiry_loop)
                    nursery.start_soon(self.links.bootstrap_loop, list(cfg.node.bootstrap))
                    nursery.start_soon(self.links.liveness_loop)
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

    def _guarded(self, handler: Any) -> Any:
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

    # ------------------------------------------------------------------ adverts

    def local_advert(self) -> Advert:
        models = []
        for s in self.runner.models.values():
            models.append(
                ModelAdvert(
                    name=s.name,
                    num_layers=s.num_layers,
                    layer_start=s.layer_start,
                    layer_end=s.layer_end,
                    prefill_tps=round(s.prefill_tps, 1),
                    decode_tps=round(s.decode_tps, 1),
                    free_kv_tokens=self.stage_server.free_kv_tokens(s.name),
                    hidden_size=int(getattr(s.model, "hidden_size", 0) or 0),
                    prefill_ms_per_layer_token=round(self.stage_server.speed(s.name).prefill_ms_per_layer_token, 4),
                    decode_ms_per_layer=round(self.stage_server.speed(s.name).decode_ms_per_layer, 4),
                    context_length=self.runner.context_length(s.name) or 0,
                    tokenizer=self.runner.tokenizer_identity(s.name),
                )
            )
        served = list(self.runner.models.values())
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
            addrs=tuple(self.addrs[:8]),
            hardware=self.hardware.to_dict() if self.hardware is not None else {},
            models=tuple(models),
            queue_depth=self.runner.queue_depth(),
            in_flight=self.runner.in_flight() + len(self.stage_server.sessions),
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
        )

    def sign_advert(self) -> bytes:
        """This node's advert with the next sequence number, signed, as gossip carries it."""
        self.seq = max(self.seq + 1, int(time.time() * 1000))
        body = self.local_advert().encode()
        sig = self.identity.key_pair.private_key.sign(signing_payload(body))
        return encode_message(
            MessageType.ADVERT, {"body": body, "sig": sig, "cert": self.identity.certificate_bytes}
        )

    async def publish_advert(self) -> None:
        assert self.gossip is not None
        data = self.sign_advert()
        self._own_signed = data
        try:
            with trio.fail_after(5):
                await self.gossip.publish(ADVERT_TOPIC, data)
            self.stats["adverts_published"] += 1
        except Exception as e:
            log.warning("advert publish failed error=%r", e)

    async def _advert_loop(self) -> None:
        g = self.config.gossip
        if self.links is not None:
            # learn the mesh from the bootstrap peer before the mesh learns of us: everyone
            # dials a newcomer at once, and our SYNC should not queue behind those handshakes
            with trio.move_on_after(JOIN_SYNC_WAIT_S):
                await self.links.synced.wait()
        last = -1e9
        period = g.advert_interval_s
        published_load: tuple[int, int] = (-1, -1)
        while True:
            now = trio.current_time()
            load = (self.runner.queue_depth(),
                    self.runner.in_flight() + len(self.stage_server.sessions))
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

    def _reject(self, reason: str) -> bool:
        self.stats["adverts_rejected"] += 1
        self.rejections[reason] = self.rejections.get(reason, 0) + 1
        return False

    def _validate_advert(self, author: str, data: bytes) -> bool:
        """Gossip validator: attested author, valid signature, schema, not a replay. Sync.

        The very advert we hold for a live peer already (it came first by SYNC) is accepted
        without being applied again: rejecting it as a replay would stop gossip from forwarding
        it, and the peers behind us would never hear it."""
        if author in self.table.entries and self._signed.get(author) == data:
            return True  # not put in _validated: _receive_adverts skips it
        return self._check_advert(author, data)

    def _check_advert(self, author: str, data: bytes) -> bool:
        """Attested author, valid signature, schema, not a replay; a good advert is kept in
        ``_validated`` for ``_apply_advert``."""
        try:
            msg = decode_message(data, MAX_ADVERT_BYTES + 2048, frozenset({int(MessageType.ADVERT)}))
        except ProtocolError as e:
            log.info("advert rejected author=%s reason=%s", author, e)
            return self._reject("malformed")
        try:
            cert = self._check_cert(msg["cert"], author, time.time())
        except MeshdError as e:
            return self._reject(f"unattested:{getattr(e, 'reason', 'certificate')}")
        try:
            Ed25519PublicKey.from_public_bytes(cert.public_key).verify(
                msg["sig"], signing_payload(msg["body"])
            )
        except (InvalidSignature, ValueError):
            return self._reject("bad_signature")
        try:
            adv = decode_advert(msg["body"])
        except ProtocolError as e:
            log.info("advert rejected author=%s reason=%s", author, e)
            return self._reject("malformed")
        if adv.peer_id != author:
            return self._reject("author_mismatch")
        last = self.table.last_seq.get(author, -1)
        if author != self.peer_id and adv.seq <= last:
            self.stats["adverts_replayed"] += 1
            return self._reject("replay")
        # Labels and region come from the certificate, never from the advert's own claims.
        trusted = Advert(**{**_fields(adv), "labels": dict(cert.labels),
                            "region": cert.labels.get("region", ""), "name": cert.name})
        if len(self._validated) > VALIDATED_CACHE:
            self._validated.clear()
        self._validated[bytes(data)] = trusted
        return True

    def _check_cert(self, cert_bytes: Any, author: str, now: float) -> Certificate:
        """``Attestor.check`` with the CA signature check remembered per certificate (it is pure
        and ~1 ms; every advert carries its author's certificate). Binding to the author,
        revocation and the validity window are checked every time."""
        cert = self._cert_memo.get(cert_bytes) if isinstance(cert_bytes, bytes) else None
        if cert is None:
            cert = verify_signature(cert_bytes, ca_public_key=self.attestor.ca_public_key)
            if len(self._cert_memo) >= CERT_MEMO:
                self._cert_memo.clear()
            self._cert_memo[bytes(cert_bytes)] = cert
        return check_certificate(cert, remote_peer_id=author, now=now, revoked=self.attestor.revoked,
                                 clock_skew_s=self.attestor.clock_skew_s)

    async def _receive_adverts(self, sub: Any) -> None:
        while True:
            msg = await sub.get()
            data = bytes(msg.data)
            adv = self._validated.pop(data, None)
            if adv is None:
                continue  # our own advert, or one that failed validation
            if self._apply_advert(adv, data):
                # publish-to-receipt delay (meaningful where clocks agree: the benchmark's loopback)
                self.advert_delays_ms.append(max(0.0, (time.time() - adv.ts) * 1000.0))
                self.stats["adverts_timed"] += 1

    def _apply_advert(self, adv: Advert, data: bytes) -> bool:
        """Put a validated advert in the table; True when it was new information."""
        verdict = self.table.apply(adv, trio.current_time(), time.time())
        if verdict in (Verdict.NEW, Verdict.UPDATED):
            self.stats["adverts_accepted"] += 1
            self._signed[adv.peer_id] = data
            self._dropped_seq.pop(adv.peer_id, None)
            if self.links is not None:
                self.links.on_advert(adv, new=verdict is Verdict.NEW)
            if verdict is Verdict.NEW:
                log.info("peer joined name=%s peer_id=%s", adv.name, adv.peer_id)
                if self.revocation_bytes is not None and self.links is not None:
                    self.links.schedule_revocation_gossip()
            return True
        if verdict in (Verdict.REPLAY, Verdict.STALE):
            self.stats["adverts_replayed"] += 1
            self._reject(verdict.value)
        return False

    def own_signed_advert(self) -> bytes | None:
        return self._own_signed

    def signed_adverts(self) -> list[bytes]:
        """The signed adverts this node holds (its own first), for a new link's SYNC."""
        live = {e.advert.peer_id for e in self.table.live()}
        out = [self._own_signed] if self._own_signed is not None else []
        out += [d for pid, d in sorted(self._signed.items()) if pid in live]
        return out[:SYNC_MAX_ADVERTS]

    def accept_synced(self, items: list[Any]) -> int:
        """Check adverts a peer handed over on a new link exactly as gossip is checked, then
        apply them, so a joining node knows the mesh at once instead of after one period."""
        applied = 0
        for data in items[:SYNC_MAX_ADVERTS]:
            if not isinstance(data, bytes) or len(data) > MAX_ADVERT_BYTES + 2048:
                self._reject("malformed")
                continue
            try:
                body = decode_message(data, MAX_ADVERT_BYTES + 2048, frozenset({int(MessageType.ADVERT)}))
                claimed = decode_advert(body["body"])
            except ProtocolError:
                self._reject("malformed")
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
            adv = self._validated.pop(data, None) if self._check_advert(author, data) else None
            if adv is not None and self._apply_advert(adv, data):
                applied += 1
            elif readmit:
                self.table.last_seq[author] = claimed.seq
        self.stats["adverts_synced"] += applied
        return applied

    def drop_peer(self, peer_id: str) -> bool:
        """Our link to ``peer_id`` broke (lost connection, stall): stop routing to it. Its latest
        advert may come back through a SYNC (``accept_synced``) once links are up again."""
        e = self.table.get(peer_id)
        if e is not None:
            self._dropped_seq[peer_id] = e.advert.seq
            if len(self._dropped_seq) > 4 * self.config.node.max_peers:
                self._dropped_seq = {p: q for p, q in self._dropped_seq.items() if p == peer_id}
        return self.table.drop(peer_id)

    async def _expiry_loop(self) -> None:
        while True:
            await trio.sleep(min(1.0, self.config.gossip.advert_interval_s / 2))
            for pid in self.table.expire(trio.current_time()):
                log.info("peer expired peer_id=%s", pid)

    # ------------------------------------------------------------------ revocations

    def _validate_revocation(self, author: str, data: bytes) -> bool:
        # any author may relay a list: the CA's signature is what counts
        try:
            msg = decode_message(data, 300_000, frozenset({int(MessageType.REVOCATION)}))
            from meshd.core.crl import verify_revocation_list

            verify_revocation_list(msg["crl"], ca_public_key=self.identity.ca_public_key)
        except MeshdError:
            return self._reject("bad_revocation")
        return True

    async def apply_revocation_bytes(self, crl: bytes, *, gossip: bool) -> list[str]:
        assert self.host is not None
        before = self.attestor.revocation_list
        doomed = await apply_revocation(self.host, self.attestor, crl)
        changed = self.attestor.revocation_list is not before
        if changed:
            self.revocation_bytes = crl
            self._persist_revocation(crl)
            log.warning("revocation list applied version=%s disconnected=%d",
                        self.attestor.revocation_list.version if self.attestor.revocation_list else 0,
                        len(doomed))
        gone = [p.to_base58() for p in doomed]
        # also drop any peer (connected or heard through gossip) whose serial is now revoked
        revoked = self.attestor.revoked
        for pid in list(self.table.entries):
            cert = self.attestor.certificate_of(pid)
            if pid in gone or (cert is not None and cert.serial in revoked):
                self.table.drop(pid)
        self.revoked_peer_ids.update(gone)
        if changed and gossip and self.gossip is not None:
            await self.gossip.publish(REVOCATION_TOPIC, encode_message(MessageType.REVOCATION, {"crl": crl}))
        return gone

    def _persist_revocation(self, crl: bytes) -> None:
        try:
            d = self.config.path(self.config.node.data_dir)
            d.mkdir(parents=True, exist_ok=True)
            tmp = d / "revocations.bin.tmp"
            tmp.write_bytes(crl)
            tmp.replace(d / "revocations.bin")
        except OSError as e:
            log.warning("cannot persist revocation list error=%s", e)

    async def _receive_revocations(self, sub: Any) -> None:
        while True:
            msg = await sub.get()
            try:
                m = decode_message(bytes(msg.data), 300_000, frozenset({int(MessageType.REVOCATION)}))
                await self.apply_revocation_bytes(m["crl"], gossip=False)
            except MeshdError as e:
                log.info("revocation ignored error=%s", e)

    # ------------------------------------------------------------------ RTT / Vivaldi

    def on_rtt(self, peer_id: str, raw_ms: float) -> None:
        """A ping's round trip. A busy node (ours or the peer's) only ever adds delay to a
        sample, so the network's RTT is the floor of the recent ones: the minimum of the last
        ``RTT_WINDOW`` (about 40 s of pings at the default ``ping_interval_s``) feeds both the
        table and Vivaldi. Without it, CPU saturation on a small box drags every coordinate away
        (measured on the testnet)."""
        if self.links is not None:
            self.links.on_pong(peer_id)
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

    def snapshot(self) -> Any:
        return build_snapshot(self.local_advert(), self.table.live(), self.coord, trio.current_time())

    def status(self) -> dict[str, Any]:
        return node_status(self)

    def peers_listing(self) -> list[dict[str, Any]]:
        return peers_listing(self)

    def ready_state(self) -> tuple[bool, str]:
        """Ready to take requests: running, and holding a local model or a peer to forward to."""
        if not self.ready.is_set():
            return False, "starting"
        if self.runner.models or len(self.table):
            return True, "ready"
        return False, "no local model and no attested peer yet"


def _fields(adv: Advert) -> dict[str, Any]:
    return {f: getattr(adv, f) for f in adv.__dataclass_fields__}


def _in_trio() -> bool:
    try:
        trio.lowlevel.current_task()
        return True
    except RuntimeError:
        return False

