"""Cells in the daemon: the summary topic, the summariser duty, bridges, and probes.

With ``[gossip] cells`` on (docs/gossip-at-scale.md), membership gossips full adverts only on its
cell's topic; this service does the rest:

* **summaries**: it takes the cells' signed summaries from the mesh-wide topic
  (``meshd.core.summary.check_summary``: attested author, signature, the author is a member of
  the cell it summarises) into a ``SummaryTable``, which forgets a cell whose summary has not been
  renewed for ``summary_interval_s x summary_expiry_intervals``;
* **the summariser duty**: once per period, the member that ``meshd.core.cells.summariser``
  names among the live members this node knows publishes the cell's summary
  (``meshd.core.probes.summarise_cell``, as the simulator's cells summarise themselves);
* **links across cells**: a node links to members its own cell's summary names that it lacks
  (how a node whose bootstrap peer is in another cell finds its cell), and keeps ``bridges``
  links to nodes of other cells, over which the mesh-wide topics (summaries, revocations) cross;
* **probes**: before an entry node routes a model, it asks ``probes`` nodes of other cells for a
  fresh signed advert (``reach``; cells ranked and nodes drawn by ``meshd.core.probes``, the
  simulator's code); the answers join its peer table as candidates for ``3 x probe_interval_s``.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable
from typing import Any, Protocol

import trio

from meshd.config import Config
from meshd.core import cells as cellmath
from meshd.core import probes
from meshd.core.advert import Advert
from meshd.core.advert_check import Rejected
from meshd.core.summary import (
    CellSummary,
    ModelSummary,
    Rep,
    check_summary,
    claimed_author,
    percentile,
    seal_summary,
)
from meshd.core.summary_table import SummaryTable
from meshd.core.vivaldi import Coord, estimate_rtt_ms
from meshd.errors import PeerGoneError
from meshd.net.identity import NodeIdentity
from meshd.node.links import Links
from meshd.node.membership import Membership
from meshd.node.view import labels_allow, peer_rtt

log = logging.getLogger(__name__)

TICK_S = 1.0  # maintenance: expiry, own-cell links, bridges
REDIAL_S = 10.0  # a node named by a summary is dialled at most this often
PULL_S = 3.0  # a node that misses cells asks a linked peer for its summaries at most this often
PROBE_TIMEOUT_S = 5.0  # the dial and the answer each (links.DIAL_TIMEOUT_S)
UNKNOWN_RTT_MS = 100.0
MAX_SYNCED = 256

# Other cells serving a model: (score, cell); the nodes each names; their addresses.
_Scored = tuple[list[tuple[float, str]], dict[str, list[str]], dict[str, tuple[str, ...]]]


def member_wait_ms(a: Advert) -> float:
    """A member's typical wait from its advert, as cell summaries and the probe gate score it."""
    return probes.typical_wait_ms(a.queue_depth, a.in_flight, a.max_concurrency,
                                  a.prefill_tps or 1000.0, a.decode_tps or 50.0)


def whole_models(a: Advert) -> list[str]:
    """The models an advert serves whole (every layer)."""
    return [x.name for x in a.models if x.layer_start == 0 and x.layer_end == x.num_layers]


class SummaryGossip(Protocol):
    def set_validator(self, topic: str, validator: Callable[[str, bytes], bool]) -> None: ...

    async def subscribe(self, topic: str) -> Any: ...

    async def publish(self, topic: str, data: bytes) -> None: ...


class Cells:
    def __init__(self, config: Config, identity: NodeIdentity, membership: Membership, *,
                 rng: random.Random | None = None) -> None:
        assert membership.cell is not None, "cells are off"
        self.config = config
        self.g = config.gossip
        self.identity = identity
        self.membership = membership
        self.cell: str = membership.cell
        self.peer_id = membership.peer_id
        self.rng = rng or random.Random()
        self.table = SummaryTable(ttl_s=self.g.summary_interval_s * self.g.summary_expiry_intervals)
        self.links: Links | None = None
        self._gossip: SummaryGossip | None = None
        self._nursery: trio.Nursery | None = None
        self._validated: dict[bytes, CellSummary] = {}
        # when a probe round for (model, residency) last started or was decided against
        self._probed_at: dict[tuple[str, str], float] = {}
        self._probing: dict[str, trio.Event] = {}
        self._dialled: dict[str, float] = {}
        self._pulled_at = -math.inf
        self._seen_cells = (0, -math.inf)  # the most cells held lately, and since when
        self.rejections: dict[str, int] = {}
        self.stats = {"summaries_published": 0, "summaries_accepted": 0, "summaries_rejected": 0,
                      "cells_expired": 0, "probes_sent": 0, "probes_answered": 0,
                      "probe_bytes_in": 0, "probe_rounds": 0, "probes_skipped": 0, "links_opened": 0, "summary_pulls": 0,
                      "summary_pulls_on_demand": 0}

    async def run(self, gossip: SummaryGossip, links: Links, *,
                  task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        self._gossip = gossip
        self.links = links
        links.on_sync_summaries = self.accept_synced
        gossip.set_validator(cellmath.SUMMARY_TOPIC, self.validate)
        sub = await gossip.subscribe(cellmath.SUMMARY_TOPIC)
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._receive, sub)
            nursery.start_soon(self._summarise_loop)
            nursery.start_soon(self._maintain_loop)
            task_status.started()

    # ------------------------------------------------------------------ summaries in

    def _cell_of_cert(self, peer_id: str, labels: dict[str, str]) -> str | None:
        return self.membership.cell_of(peer_id, labels)

    def _check(self, author: str, data: bytes) -> CellSummary | None:
        m = self.membership
        out = check_summary(data, author, time.time(), m.checker, self._cell_of_cert,
                            revoked=m.attestor.revoked)
        if isinstance(out, Rejected):
            self.stats["summaries_rejected"] += 1
            self.rejections[out.reason] = self.rejections.get(out.reason, 0) + 1
            log.debug("summary rejected author=%s reason=%s %s", author, out.reason, out.detail)
            return None
        return out

    def validate(self, author: str, data: bytes) -> bool:
        """Gossip validator of the summary topic. Sync; never raises."""
        s = self._check(author, data)
        if s is None:
            return False
        if len(self._validated) > 1024:
            self._validated.clear()
        self._validated[bytes(data)] = s
        return True

    async def _receive(self, sub: Any) -> None:
        while True:
            msg = await sub.get()
            data = bytes(msg.data)
            s = self._validated.pop(data, None)
            if s is not None:
                self._take(s, data)

    def _take(self, s: CellSummary, data: bytes) -> None:
        if self.table.apply(s, data, trio.current_time(), time.time()):
            self.stats["summaries_accepted"] += 1

    def accept_synced(self, items: list[Any]) -> None:
        """Summaries a new link handed over (SYNC): checked exactly as gossiped ones."""
        for data in items[:MAX_SYNCED]:
            author = claimed_author(data)
            if author is None:
                continue
            s = self._check(author, data)
            if s is not None:
                self._take(s, data)

    def signed_summaries(self) -> list[bytes]:
        """The summaries held, as gossiped (for a new link's SYNC)."""
        return self.table.signed()[:MAX_SYNCED]

    # ------------------------------------------------------------------ the summariser duty

    async def _summarise_loop(self) -> None:
        m = self.membership
        with trio.move_on_after(2.0):
            await m.joined.wait()
        await trio.sleep(self.rng.uniform(0.1, 0.5))  # cell members that start together spread out
        interval = self.g.summary_interval_s
        last = -1
        while True:
            period = cellmath.summary_period(time.time(), interval)
            if period != last:
                who = cellmath.summariser([self.peer_id, *m.cell_members()], period)
                if who == self.peer_id or last < 0:  # the first one: let the mesh know us at once
                    await self.publish_summary(period)
                last = period
            next_at = (period + 1) * interval
            await trio.sleep(max(0.05, next_at - time.time() + self.rng.uniform(0.0, 0.2)))

    def build_summary(self, period: int) -> CellSummary:
        """This cell as this node sees it: itself and the live members of its table."""
        m = self.membership
        adverts = [m.local_advert()] + [e.advert for e in m.table.live() if m.via.get(e.advert.peer_id) != "probe"]
        k = self.g.summary_top_k
        rows = []
        for a in adverts:
            rows.append((member_wait_ms(a), a.peer_id, whole_models(a)))
        top, best_of, _ = probes.summarise_cell(rows, k)
        by_id = {a.peer_id: a for a in adverts}
        models = []
        for name in sorted(top, key=lambda n: (-len([r for r in rows if n in r[2]]), n)):
            serving = [by_id[pid] for _, pid, ms in rows if name in ms]
            loads = [float(a.queue_depth + a.in_flight) for a in serving]
            models.append(ModelSummary(name, sum(a.service_rate_rps for a in serving), best_of[name],
                                       percentile(loads, 0.5), percentile(loads, 0.9), tuple(top[name])))
        named = sorted({pid for t in top.values() for pid in t})
        reps = tuple(Rep(pid, by_id[pid].name, tuple(by_id[pid].addrs[:2])) for pid in named)
        vecs = [a.coord for a in adverts if a.coord and len(a.coord) == len(m.coord.vec)]
        centroid = tuple(sum(v[i] for v in vecs) / len(vecs) for i in range(len(vecs[0]))) if vecs else ()
        return CellSummary(self.cell, self.peer_id, period, time.time(), len(adverts), tuple(models),
                           reps, centroid)

    async def publish_summary(self, period: int) -> None:
        assert self._gossip is not None
        s = self.build_summary(period)
        ident = self.identity
        data = seal_summary(s, ident.key_pair.private_key.sign, ident.certificate_bytes)
        self._take(s, data)
        try:
            with trio.fail_after(5):
                await self._gossip.publish(cellmath.SUMMARY_TOPIC, data)
            self.stats["summaries_published"] += 1
        except Exception as e:
            log.warning("summary publish failed error=%r", e)

    # ------------------------------------------------------------------ links across cells

    async def _maintain_loop(self) -> None:
        while True:
            await trio.sleep(TICK_S)
            gone = self.table.expire(trio.current_time())
            if gone:
                self.stats["cells_expired"] += len(gone)
                log.info("cells forgotten cells=%s", ",".join(gone))
            self._pull_summaries()
            self._link_own_cell()
            self._keep_bridges()

    def _pull_summaries(self) -> None:
        """Anti-entropy: a node that knows no other cell, or no member of its own, asks a linked
        peer for the summaries it holds (SYNC_REQ ``summaries_only``). A joining node synced
        with its bootstrap peer before that peer heard the mesh, and the gossipsub mesh of the
        summary topic does not reach a node linked to its bootstrap peer only."""
        links = self.links
        now = trio.current_time()
        most, since = self._seen_cells
        if len(self.table) >= most or now - since > 2 * self.table.ttl_s:
            self._seen_cells = (len(self.table), now)  # cells that died are not missed for long
        if links is None or now - self._pulled_at < PULL_S:
            return
        missing = len(self.table) < self._seen_cells[0]
        if len(self.table) > 1 and self.membership.cell_members() and not missing:
            return
        self._pulled_at = now
        alive = self._alive_links()
        if alive:
            self._spawn(self._pull, self.rng.choice(alive))
            return
        # no channel at all (its bootstrap channel failed to open): through a bootstrap peer
        boot = [a for a in self.config.node.bootstrap if "/p2p/" in a]
        if boot:
            where, pid = self.rng.choice(boot).rsplit("/p2p/", 1)
            self._spawn(self._link, pid, (where,), True)

    async def _pull_for(self, model: str, now: float) -> None:
        """No member of our cell serves ``model`` and no summary we hold names it: the summary
        naming it may not have reached us yet (summaries come every ``summary_interval_s``),
        so ask a linked peer for the summaries it holds (at most once per ``PULL_S``, waiting
        up to ``probe_wait_s``) before the request is refused."""
        alive = self._alive_links()
        if not alive or now - self._pulled_at < PULL_S:
            return
        self._pulled_at = now
        self.stats["summary_pulls_on_demand"] += 1
        with trio.move_on_after(self.g.probe_wait_s):
            try:
                await self._pull(self.rng.choice(alive))
            except (PeerGoneError, trio.TooSlowError):
                pass

    def _alive_links(self) -> list[str]:
        links = self.links
        return [] if links is None else sorted(p for p, ch in links.channels.items() if ch.alive)

    async def _pull(self, peer_id: str) -> None:
        assert self.links is not None
        ch = self.links.channels.get(peer_id)
        if ch is None:
            return
        self.stats["summary_pulls"] += 1
        reply = await ch.sync_reply(PROBE_TIMEOUT_S, None, summaries_only=True)
        self.accept_synced(list(reply.get("summaries") or []))
        self._link_own_cell()

    def _may_dial(self, pid: str) -> bool:
        now = trio.current_time()
        if pid == self.peer_id or now - self._dialled.get(pid, -math.inf) < REDIAL_S:
            return False
        if pid in self.membership.revoked_peer_ids:
            return False
        self._dialled[pid] = now
        return True

    def _link_own_cell(self) -> None:
        """Link to the members our cell's summary names that our table lacks (a SYNC with one of
        them brings the rest of the cell)."""
        s = self.table.get(self.cell)
        if s is None:
            return
        for r in s.reps:
            if self.membership.table.get(r.peer_id) is None and self._may_dial(r.peer_id):
                self._spawn(self._link, r.peer_id, r.addrs, True)

    def _keep_bridges(self) -> None:
        links = self.links
        if links is None or not self.g.bridges:
            return
        members = set(self.membership.cell_members())
        bridged = [p for p, ch in links.channels.items() if ch.alive and p not in members]
        if len(bridged) >= self.g.bridges:
            return
        others = [s for s in self.table.summaries() if s.cell != self.cell and s.reps]
        if not others:
            return
        s = self.rng.choice(others)
        r = self.rng.choice(s.reps)
        if r.peer_id not in links.channels and self._may_dial(r.peer_id):
            self._spawn(self._link, r.peer_id, r.addrs, False)

    def _spawn(self, fn: Callable[..., Any], *args: Any) -> None:
        if self._nursery is not None:
            self._nursery.start_soon(fn, *args)

    async def _link(self, peer_id: str, addrs: tuple[str, ...], sync: bool) -> None:
        assert self.links is not None
        try:
            with trio.fail_after(PROBE_TIMEOUT_S * 3):
                await self.links.channel(peer_id, addrs, sync=sync)
            self.stats["links_opened"] += 1
        except (PeerGoneError, trio.TooSlowError) as e:
            log.info("cell link failed peer_id=%s error=%s", peer_id, e)

    # ------------------------------------------------------------------ probes

    def _cell_rtt_ms(self, s: CellSummary) -> float:
        local = self.membership.coord
        if not s.coord or len(s.coord) != len(local.vec):
            return UNKNOWN_RTT_MS
        return estimate_rtt_ms(local, Coord(s.coord, 0.0, 1.0, 0.0))

    def _named(self, model: str) -> bool:
        """Whether a summary of another cell names a node serving ``model``."""
        return any(s.cell != self.cell and (ms := s.model(model)) is not None and ms.nodes
                   for s in self.table.summaries())

    def _scored(self, model: str) -> _Scored:
        """Other cells serving ``model``: (score, cell) with score = RTT to the cell plus its
        summary's best wait; the nodes each names; their addresses."""
        scored, named, addrs = [], {}, {}
        for s in self.table.summaries():
            ms = s.model(model)
            if s.cell == self.cell or ms is None or not ms.nodes:
                continue
            scored.append((self._cell_rtt_ms(s) + ms.best_ms, s.cell))
            named[s.cell] = list(ms.nodes)
            addrs.update({r.peer_id: r.addrs for r in s.reps})
        return scored, named, addrs

    def local_best_ms(self, model: str, residency: str | None = None) -> float:
        """The best RTT plus typical wait among the members of this node's cell that serve
        ``model`` whole, itself included (RTT 0), scored from their adverts as ``build_summary``
        scores them (``member_wait_ms``), with the RTT the router would use
        (``meshd.node.view.peer_rtt``): ``meshd.core.probes.local_best_ms``, the simulator's
        figure too; inf when none does. ``residency``: only members whose
        labels allow it count (``labels_allow``, as the router filters them)."""
        m = self.membership
        now = trio.current_time()
        candidates: list[tuple[Advert, float | None]] = [(m.local_advert(), 0.0)]
        for e in m.table.live():
            if m.via.get(e.advert.peer_id) != "probe":
                candidates.append((e.advert, None))
        members: list[tuple[float, float]] = []
        for a, rtt in candidates:
            if model not in whole_models(a):
                continue
            if not labels_allow(a.labels, residency):
                continue
            if rtt is None:
                rtt = peer_rtt(m.table.entries[a.peer_id], m.coord, now)[0]
            members.append((rtt, member_wait_ms(a)))
        return probes.local_best_ms(members)

    def pick(self, model: str, scored: _Scored | None = None) -> list[tuple[str, tuple[str, ...]]]:
        """The nodes to probe for ``model`` (``meshd.core.probes``: the simulator's picks), with
        the addresses the summaries give for them; ``scored``: ``_scored(model)`` if the caller
        has it already."""
        scored_cells, named, addrs = scored if scored is not None else self._scored(model)
        ranked = probes.rank_cells(scored_cells, self.g.probes)
        linked = self.links.channels if self.links is not None else {}
        picks = probes.pick_probes(ranked, named, self.g.probes, self.rng,
                                   {p for p, ch in linked.items() if ch.alive})
        return [(p, addrs.get(p, ())) for p in picks if p != self.peer_id]

    async def reach(self, model: str, *, need: bool, residency: str | None = None) -> None:
        """Before routing ``model``: probe other cells if a round is due and another cell may beat
        this one (``meshd.core.probes.worth_probing``; in the background, its answers serve the
        following decisions); with ``need`` (no member of our cell that ``residency`` allows
        serves it) wait up to ``probe_wait_s`` for the answers. One decision per model and
        residency per ``probe_interval_s``: a round skipped for requests without residency
        does not hold back one whose residency our cell cannot serve."""
        if not model or not self.g.probes:
            return
        now = trio.current_time()
        if need and not self._named(model):
            await self._pull_for(model, now)
        running = self._probing.get(model)
        key = (model, residency or "")
        if running is None and now - self._probed_at.get(key, -math.inf) >= self.g.probe_interval_s:
            scored = self._scored(model)
            if not need and not probes.worth_probing(
                    self.local_best_ms(model, residency), (sc for sc, _ in scored[0])):
                self._probed_at[key] = now  # decided for this interval (the simulator too)
                self.stats["probes_skipped"] += 1
                return
            targets = self.pick(model, scored)
            if targets:
                self._probed_at[key] = now
                running = self._probing[model] = trio.Event()
                self._spawn(self._probe_round, model, targets, running)
        if need and running is not None:
            with trio.move_on_after(self.g.probe_wait_s):
                await running.wait()

    async def _probe_round(self, model: str, targets: list[tuple[str, tuple[str, ...]]],
                           done: trio.Event) -> None:
        self.stats["probe_rounds"] += 1
        try:
            async with trio.open_nursery() as nursery:
                for pid, addrs in targets:
                    nursery.start_soon(self._probe, pid, addrs)
        finally:
            self._probing.pop(model, None)
            done.set()

    async def _probe(self, peer_id: str, addrs: tuple[str, ...]) -> None:
        assert self.links is not None
        self.stats["probes_sent"] += 1
        try:
            with trio.fail_after(PROBE_TIMEOUT_S):
                ch = await self.links.channel(peer_id, addrs, sync=False)
            t0 = trio.current_time()
            reply = await ch.sync_reply(PROBE_TIMEOUT_S, None, fresh=True)
            rtt_ms = (trio.current_time() - t0) * 1000.0
        except (PeerGoneError, trio.TooSlowError):
            return
        items = reply.get("adverts") or []
        self.stats["probe_bytes_in"] += sum(len(x) for x in items if isinstance(x, bytes))
        if self.membership.accept_probed(peer_id, items):
            self.stats["probes_answered"] += 1
            self.membership.on_rtt(peer_id, rtt_ms)  # the probe's round trip is a measured RTT

    # ------------------------------------------------------------------ what clients read

    def summary_peers(self) -> list[dict[str, Any]]:
        """Nodes this node knows only through summaries (named by one, not in its table)."""
        table = self.membership.table
        now = time.time()
        rows: dict[str, dict[str, Any]] = {}
        for s in self.table.summaries():
            for r in s.reps:
                if r.peer_id == self.peer_id or table.get(r.peer_id) is not None or r.peer_id in rows:
                    continue
                rows[r.peer_id] = {
                    "name": r.name, "peer_id": r.peer_id, "cell": s.cell, "known_by": "summary",
                    "region": "", "labels": {}, "hardware": {},
                    "models": [{"name": ms.name, "layers": [0, 0], "num_layers": 0}
                               for ms in s.models if r.peer_id in ms.nodes],
                    "queue_depth": None, "in_flight": None, "prefill_tps": None, "decode_tps": None,
                    "advert_age_s": round(max(0.0, now - s.ts), 3), "seq": None, "rtt_ms": None,
                    "rtt_source": "unknown", "rtt_measured_ms": None, "rtt_estimated_ms": None,
                    "stalled": False,
                }
        return [rows[p] for p in sorted(rows)]

    def statistics(self) -> dict[str, Any]:
        now = time.time()
        return {
            **self.stats,
            "cell": self.cell,
            "rejections": dict(self.rejections),
            "cells": {
                s.cell: {"members": s.members, "period": s.period, "age_s": round(now - s.ts, 3),
                         "models": {ms.name: {"capacity_rps": ms.capacity_rps, "best_ms": ms.best_ms,
                                              "queue_p50": ms.queue_p50, "queue_p90": ms.queue_p90,
                                              "nodes": len(ms.nodes)} for ms in s.models}}
                for s in self.table.summaries()
            },
        }

