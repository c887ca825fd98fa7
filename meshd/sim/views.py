"""What one entry node knows when it decides: the ``MeshSnapshot`` handed to the real router.

The view is hierarchical (docs/gossip-at-scale.md):

* **cell members**: every node of the entry's cell, from the newest advert of theirs that has
  reached this entry (adverts are published every ``advert_interval_s``, spread through the cell
  in ``advert_delay_ms``, and each receiver misses each one with ``advert_loss``), so queue
  figures are as stale as they would be on a real node, plus the load this entry sent since;
* **probes**: a few nodes of other cells, picked from the cell summaries (the least-loaded
  nodes of the best-looking cells), whose load this entry asked for directly a moment ago.

Adverts are not delivered one message per receiver: a node's last few adverts are kept with the
instant each reached its cell, and a receiver's view is worked out when it decides. This is exact
for the model (one delay per advert, independent loss per receiver) and costs O(cell) per
decision instead of O(cell) per advert per receiver.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import random
from typing import Any

from meshd.core import predict, probes
from meshd.core.routing import residency_allows
from meshd.core.snapshot import MeshSnapshot, NodeView, Serving
from meshd.core.vivaldi import Coord, estimate_rtt_ms
from meshd.sim.scenario import Scenario
from meshd.sim.world import SimNode, World

_EXPECTED_FIELDS = (
    "peer_id", "name", "region", "labels", "serving", "queue_depth", "in_flight",
    "max_concurrency", "max_queue", "prefill_tps", "decode_tps", "rtt_ms", "rtt_source",
    "advert_age_s", "sent_since_advert", "cost_per_hour", "free_kv_tokens", "is_local",
    "service_rate_rps", "coord", "free_memory_bytes", "power_w",
)  # fmt: skip
_FIELDS = tuple(f.name for f in dataclasses.fields(NodeView))
# NodeView is built positionally on the hot path (about 25% faster than by keyword).
_POSITIONAL = _FIELDS[: len(_EXPECTED_FIELDS)] == _EXPECTED_FIELDS
_FREE_KV = 1 << 30
_NONE: frozenset[int] = frozenset()
PROBE_SLACK_MS = probes.PROBE_SLACK_MS  # cells this close to the best one are equally worth probing


def make_view_factory(t: SimNode) -> None:
    """Give ``t`` a constructor of its NodeView with the fields that never change filled in."""
    if _POSITIONAL:
        t.nv = functools.partial(NodeView, t.peer_id, t.name, t.region_name, t.labels, t.serving)
        t.nv_tail = (t.slots, t.max_queue, t.prefill_tps, t.decode_tps)
    else:
        t.nv = None
        t.nv_tail = ()


def _view(
    t: SimNode, q: int, inf: int, rtt: float, src: str, age: float, sent: int, local: bool,
    coord: Coord, serving: tuple[Serving, ...] | None = None,
) -> NodeView:  # fmt: skip
    """``t`` as seen; ``serving`` is what its advert said it serves when that carried a prefix
    summary (meshd.sim.prefixes), else the node's fixed ``serving``."""
    if t.nv is not None and (serving is None or serving is t.serving):
        v: NodeView = t.nv(
            q, inf, *t.nv_tail, rtt, src, age, sent, t.cost_per_hour, _FREE_KV, local, t.rate, coord,
            None, t.power_w,
        )
        return v
    return NodeView(
        peer_id=t.peer_id, name=t.name, region=t.region_name, labels=t.labels,
        serving=t.serving if serving is None else serving, queue_depth=q, in_flight=inf, max_concurrency=t.slots,
        max_queue=t.max_queue, prefill_tps=t.prefill_tps, decode_tps=t.decode_tps, rtt_ms=rtt,
        rtt_source=src, advert_age_s=age, sent_since_advert=sent,
        cost_per_hour=t.cost_per_hour, is_local=local, service_rate_rps=t.rate, coord=coord,
        power_w=t.power_w,
    )  # fmt: skip


class Views:
    """Advert and summary state of the whole mesh, and the snapshot builder."""

    def __init__(
        self, world: World, scenario: Scenario, seed: int, nominal: tuple[int, int]
    ) -> None:
        g = scenario.gossip
        self.world = world
        self.g = g
        self.ttl = g.advert_ttl_s or 3.0 * g.advert_interval_s
        self.measured_ttl = scenario.vivaldi.measured_ttl_s
        self.oracle = scenario.vivaldi.mode == "oracle"
        # Per-entry RTT estimate cache: worth its memory while the mesh is not huge.
        self.cache_rtt = scenario.node_count <= 20_000
        self.rng = random.Random(seed * 17 + 3)
        self.nominal = nominal  # (prompt, output) tokens of a typical request, for summaries
        # Summaries: per cell, {model: [node idx, ...] best first}; the round in force and the
        # round published but not yet heard.
        self.summary: list[dict[str, list[int]]] = []
        self.summary_score: list[float] = []
        self.pending_summary: tuple[float, list[dict[str, list[int]]], list[float]] | None = None
        self.ranked: dict[tuple[int, str], list[int]] = {}  # (region, model) -> best cells
        self.probes_sent = 0
        self.probes_skipped = 0
        self.adverts_published = 0
        self.adverts_in_window = 0  # published during the run's arrival window
        self.advert_receipts = 0  # ... times the cell members that receive each
        self.window_s = scenario.run.duration_s
        self.decisions = 0
        self.candidates_seen = 0
        for node in world.nodes:
            self.set_rate(node)

    def set_rate(self, node: SimNode) -> None:
        """The service rate a node measures on its own traffic (typical requests), gossiped."""
        p, o = self.nominal
        node.rate = predict.service_rate_rps(node.slots, p, o, node.prefill_tps, node.decode_tps)
        make_view_factory(node)

    # -- adverts -----------------------------------------------------------------------------

    def publish_advert(self, node: SimNode, now: float) -> None:
        """``node`` publishes its advert; it reaches its cell after a random delay, and each
        receiver misses it with ``advert_loss`` (who misses it is drawn now)."""
        rng = self.rng
        lo, hi = self.g.advert_delay_ms
        delay = (lo + (hi - lo) * rng.random()) / 1000.0
        node.adv_seq += 1
        lost: frozenset[int] = _NONE
        p = self.g.advert_loss
        if p > 0.0:
            members = self.world.cells[node.cell]
            # Geometric gaps between receivers that miss it: O(p * cell) draws, not O(cell).
            picked = []
            i = int(math.log(1.0 - rng.random()) / math.log(1.0 - p))
            while i < len(members):
                picked.append(members[i])
                i += 1 + int(math.log(1.0 - rng.random()) / math.log(1.0 - p))
            if picked:
                lost = frozenset(picked)
        load = (len(node.queue), node.running)
        node.adv_last = now
        node.adv_load = load
        self.adverts_published += 1
        if now <= self.window_s:
            self.adverts_in_window += 1
            self.advert_receipts += len(self.world.cells[node.cell]) - 1
        serving = node.serving if node.px is None else node.px.serving(node.serving, now)
        node.adverts.append((node.adv_seq, now, now + delay, load[0], load[1], node.coord, lost,
                             serving))
        if len(node.adverts) > 4:
            del node.adverts[0]

    # -- summaries and probes ------------------------------------------------------------------

    def _wait_ms(self, t: SimNode, q: int, inf: int) -> float:
        return probes.typical_wait_ms(q, inf, t.slots, t.prefill_tps, t.decode_tps, self.nominal)

    def publish_summaries(self, now: float) -> None:
        """Every cell summarises itself (``meshd.core.probes.summarise_cell``, as the daemon's
        summariser does): its least-loaded nodes per model, best first, and its best wait."""
        nodes = self.world.nodes
        k = self.g.summary_top_k
        tops: list[dict[str, list[int]]] = []
        scores: list[float] = []
        for members in self.world.cells:
            live = (
                (self._wait_ms(t, len(t.queue), t.running), j, t.whole_models)
                for j in members
                if (t := nodes[j]).alive
            )
            top, _, best = probes.summarise_cell(live, k)
            tops.append(top)
            scores.append(best)
        self.pending_summary = (now + self.g.summary_delay_ms / 1000.0, tops, scores)

    def _summaries_now(self, now: float) -> None:
        p = self.pending_summary
        if p is not None and p[0] <= now:
            self.summary, self.summary_score = p[1], p[2]
            self.pending_summary = None
            self.ranked.clear()

    def _best_cells(self, region: int, model: str) -> list[int]:
        """The cells an entry node of ``region`` may probe into, best first.

        A cell's score is the typical RTT to its region plus its best predicted wait (from its
        summary). The candidates are every cell within ``PROBE_SLACK_MS`` of the best score, and
        at least the best ``4 * probes``: in a large mesh many cells are equally good, and
        drawing among all of them keeps a region's entry nodes from piling onto the same few.
        """
        key = (region, model)
        r = self.ranked.get(key)
        if r is None:
            lat = self.world.latency
            cr = self.world.cell_region
            r = probes.rank_cells(
                ((lat.region_rtt_ms(region, cr[c]) + self.summary_score[c], c)
                 for c, top in enumerate(self.summary) if top.get(model)),
                self.g.probes,
            )
            self.ranked[key] = r
        return r

    def _probe(self, e: SimNode, now: float, model: str,
               local: list[tuple[SimNode, int, int, float]]) -> None:
        """Ask a few nodes of good other cells for their load; answers come an RTT later. Only
        when another cell may beat the entry's own by more than the slack
        (``meshd.core.probes.worth_probing``, as the daemon decides): one decision per
        ``probe_interval_s``.

        The cells are drawn at random among the best few, and a node at random among each
        one's least-loaded, so that the entry nodes of a region do not all probe (and then
        pile onto) the same handful of nodes.
        """
        if e.probe_pending:
            done = [p for p in e.probe_pending if p[2] <= now]
            if done:
                e.probes = done
                e.probe_pending = [p for p in e.probe_pending if p[2] > now]
        if now - e.probe_at < self.g.probe_interval_s or not self.summary:
            return
        e.probe_at = now
        rng = self.rng
        cells = [c for c in self._best_cells(e.region, model) if c != e.cell]
        if not cells:
            return
        best_other = (self.world.latency.region_rtt_ms(e.region, self.world.cell_region[cells[0]])
                      + self.summary_score[cells[0]])
        local_best = probes.local_best_ms((rtt, self._wait_ms(t, q, inf)) for t, q, inf, rtt in local)
        if not probes.worth_probing(local_best, (best_other,)):
            self.probes_skipped += 1
            return
        named = {c: self.summary[c][model] for c in cells}
        picks = probes.pick_probes(cells, named, self.g.probes, rng)
        nodes = self.world.nodes
        for j in picks:
            t = nodes[j]
            self.probes_sent += 1
            if not t.alive or j in e.known_dead:
                continue
            # The probe's round trip is a measured RTT (it overrides the estimate while fresh).
            rtt = self.world.latency.sample_ms(e.idx, j, self.rng)
            e.measured[j] = (rtt, now + rtt / 1000.0)
            e.probe_pending.append((j, now, now + rtt / 1000.0, len(t.queue), t.running, rtt))

    # -- the snapshot --------------------------------------------------------------------------

    def snapshot(self, e: SimNode, now: float, model: str,
                 residency: str | None = None) -> MeshSnapshot:
        world = self.world
        nodes = world.nodes
        views: list[NodeView] = []
        add = views.append
        ttl = self.ttl
        sent_map = e.sent
        measured = e.measured
        mttl = self.measured_ttl
        dead = e.known_dead
        ecoord = e.coord
        eidx = e.idx
        oracle = self.oracle
        lat_rtt = world.latency.rtt_ms
        est = estimate_rtt_ms
        cache = e.view_cache if self.cache_rtt else None
        if cache is None and self.cache_rtt:
            cache = e.view_cache = {}
        # own-cell members serving the model whole (and allowed by the request's residency), as
        # seen: (node, queue, in flight, RTT), for the decision to probe (core.probes.worth_probing)
        local: list[tuple[SimNode, int, int, float]] | None = [] if self.g.probes else None
        for j in world.cells[e.cell]:
            t = nodes[j]
            if model not in t.models_any:
                continue
            if j == eidx:
                add(_view(e, len(e.queue), e.running, 0.0, "local", 0.0, 0, True, ecoord,
                          None if e.px is None else e.px.serving(e.serving, now)))
                if local is not None and model in e.whole_models and (
                        not residency or residency_allows(e.labels, residency)):
                    local.append((e, len(e.queue), e.running, 0.0))
                continue
            if j in dead:
                continue
            advs = t.adverts
            a = advs[-1]
            if a[2] > now or eidx in a[6]:
                k = len(advs) - 2
                while k >= 0:
                    a = advs[k]
                    if a[2] <= now and eidx not in a[6]:
                        break
                    k -= 1
                else:
                    continue
            heard = a[2]
            if now - heard > ttl:
                continue
            n_sent = 0
            s = sent_map.get(j)
            if s:
                for x in reversed(s):
                    if x <= heard:
                        break
                    n_sent += 1
            if oracle:
                rtt, src = lat_rtt(eidx, j), "measured"
            else:
                m = measured.get(j)
                if m is not None and now - m[1] <= mttl:
                    rtt, src = m[0], "measured"
                elif cache is not None:
                    # Estimated when this advert (with its coordinate) is first used, as a peer
                    # table would when the advert arrives; kept until the next advert.
                    c = cache.get(j)
                    if c is None or c[0] != a[0]:
                        c = (a[0], est(ecoord, a[5]))
                        cache[j] = c
                    rtt, src = c[1], "vivaldi"
                else:
                    rtt, src = est(ecoord, a[5]), "vivaldi"
            if local is not None and model in t.whole_models and (
                    not residency or residency_allows(t.labels, residency)):
                local.append((t, a[3], a[4], rtt))
            nv = t.nv
            if nv is not None and a[7] is t.serving:
                add(nv(a[3], a[4], *t.nv_tail, rtt, src, now - a[1], n_sent, t.cost_per_hour,
                       _FREE_KV, False, t.rate, a[5], None, t.power_w))  # fmt: skip
            else:
                add(_view(t, a[3], a[4], rtt, src, now - a[1], n_sent, False, a[5], a[7]))
        if local is not None:
            self._summaries_now(now)
            self._probe(e, now, model, local)
            for j, asked, _ready, q, inf, rtt in e.probes:
                if j in dead or nodes[j].cell == e.cell:
                    continue
                s = sent_map.get(j)
                n_sent = sum(1 for x in s if x > asked) if s else 0
                views.append(
                    _view(
                        nodes[j],
                        q,
                        inf,
                        rtt,
                        "measured",
                        now - asked,
                        n_sent,
                        False,
                        nodes[j].coord,
                        nodes[j].adverts[-1][7] if nodes[j].adverts else None,
                    )
                )
            views.sort(key=_peer_id)
        self.decisions += 1
        self.candidates_seen += len(views)
        return MeshSnapshot(local_peer_id=e.peer_id, nodes=tuple(views))

    def note_sent(self, e: SimNode, j: int, now: float) -> None:
        s = e.sent.get(j)
        if s is None:
            e.sent[j] = [now]
            return
        s.append(now)
        if len(s) > 64 or (len(s) > 8 and now - s[0] > 2 * self.ttl):
            cut = now - 2 * self.ttl
            e.sent[j] = [x for x in s if x > cut]


def _peer_id(v: NodeView) -> str:
    return v.peer_id


def summary_bytes_per_node_s(cells: int, fanout: int, size: int, interval_s: float) -> float:
    """Summary traffic a node receives in a tree of topics of at most ``fanout`` entries.

    Level 1 carries the summaries of the cells of one group of ``fanout`` cells, level 2 one
    digest per group of groups, and so on up to a single root; a node subscribes to one topic
    per level, so it hears at most ``fanout`` messages per level per interval.
    """
    total = 0
    groups = cells
    while groups > 1:
        total += min(fanout, groups)
        groups = -(-groups // fanout)
    return total * size / interval_s


def stats(views: Views) -> dict[str, Any]:
    """Decision and gossip figures: bytes per node per second, by kind (docs/gossip-at-scale.md).

    Adverts: what each node receives from its cell (payload, once per advert). Summaries: one
    topic per level of the summary tree (``summary_bytes_per_node_s``). Probes:
    what it sends and gets back. ``wire`` multiplies the gossip parts by the gossipsub degree
    (each message can reach a node once per mesh peer); ``flat`` is what every node would
    receive if every advert went to the whole mesh, at the advert rate measured.
    """
    w = views.world
    g = views.g
    n = max(len(w.nodes), 1)
    dur = max(views.window_s, 1e-9)
    adverts = views.advert_receipts * g.advert_bytes / n / dur
    summaries = summary_bytes_per_node_s(len(w.cells), g.summary_fanout, g.summary_bytes,
                                         g.summary_interval_s) if g.probes else 0.0  # fmt: skip
    probes = views.probes_sent * g.probe_bytes / n / dur
    flat = views.adverts_in_window * (n - 1) * g.advert_bytes / n / dur
    return {
        "decisions": views.decisions,
        "mean_candidates": views.candidates_seen / max(views.decisions, 1),
        "probes_sent": views.probes_sent,
        "probes_skipped": views.probes_skipped,
        "adverts_per_node_s": views.adverts_in_window / n / dur,
        "gossip_advert_bytes_per_node_s": adverts,
        "gossip_summary_bytes_per_node_s": summaries,
        "gossip_probe_bytes_per_node_s": probes,
        "gossip_payload_bytes_per_node_s": adverts + summaries + probes,
        "gossip_wire_bytes_per_node_s": (adverts + summaries) * g.gossip_degree + probes,
        "flat_advert_bytes_per_node_s": flat,
    }
