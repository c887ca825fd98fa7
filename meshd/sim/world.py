"""The simulated mesh: nodes with their hardware, place, cell, queue and gossip state.

``World`` is built once per run from a ``Scenario`` and a seed. Node placement, cells, hardware
and Vivaldi warm-up depend only on the seed, so every strategy of one comparison runs on the
very same mesh. A ``SimNode`` is both a server (slots, queue) and an entry node (what it has sent,
RTTs it measured, peers it found dead, its round-robin counter, its probes). Each node's
round-robin counter starts at an offset of its own, drawn from the run's seed.
"""

from __future__ import annotations

import random
from typing import Any

from meshd.core.snapshot import Serving
from meshd.core.vivaldi import Coord, VivaldiConfig, update
from meshd.sim.latency import LatencyModel
from meshd.sim.prefixes import NodePrefixes
from meshd.sim.scenario import Hardware, Scenario, ServeSpec

VIVALDI = VivaldiConfig()


_NO_DEAD: frozenset[int] = frozenset()
_SERVING: dict[Any, tuple[tuple[Serving, ...], frozenset[str], frozenset[str]]] = {}


def _serving(
    serve: tuple[ServeSpec, ...], models: dict[str, int]
) -> tuple[tuple[Serving, ...], frozenset[str], frozenset[str]]:
    """What a group of nodes serves, shared by all of them (100,000 nodes, a few groups)."""
    key = (serve, tuple(sorted(models.items())))
    hit = _SERVING.get(key)
    if hit is None:
        serving = tuple(
            Serving(s.model, models[s.model], s.layer_start, s.layer_end) for s in serve
        )
        whole = frozenset(s.model for s in serving if s.whole)
        hit = (serving, whole, frozenset(s.model for s in serving))
        _SERVING[key] = hit
    return hit


def note_dead(node: SimNode, peer: int) -> None:
    """``node`` found ``peer`` dead (it stops routing there)."""
    if not node.known_dead:
        node.known_dead = set()
    node.known_dead.add(peer)  # type: ignore[union-attr]


class SimNode:
    __slots__ = (
        "idx", "peer_id", "name", "region", "region_name", "cell", "hw", "serving", "labels",
        "slots", "max_queue", "prefill_tps", "decode_tps", "cost_per_hour", "power_w",
        "alive", "born_s", "died_s", "queue", "running", "busy_s", "cost", "active",
        "coord", "adverts", "adv_seq", "adv_last", "adv_load", "adv_pending", "adv_due",
        "sent", "measured", "known_dead", "rr", "probe_at", "probes", "probe_pending",
        "view_cache", "whole_models", "models_any", "rate", "nv", "nv_tail", "px",
    )  # fmt: skip

    def __init__(
        self, idx: int, region: int, region_name: str, hw: Hardware, serve: tuple[ServeSpec, ...],
        models: dict[str, int], labels: frozenset[str], born_s: float,
    ) -> None:  # fmt: skip
        self.idx = idx
        self.peer_id = f"p{idx:07d}"
        self.name = f"{region_name}-{hw.name}-{idx}"
        self.region = region
        self.region_name = region_name
        self.cell = -1
        self.hw = hw
        self.serving, self.whole_models, self.models_any = _serving(serve, models)
        self.labels = labels
        self.slots = hw.concurrency
        self.max_queue = hw.max_queue
        self.prefill_tps = hw.prefill_tps
        self.decode_tps = hw.decode_tps
        self.cost_per_hour = hw.cost_per_hour
        self.power_w = hw.power_w or None  # None: not measured (meshd.core.energy)
        self.alive = True
        self.born_s = born_s
        self.died_s = -1.0
        self.queue: list[Any] = []  # FIFO; short (max_queue), so a list beats a deque's memory
        self.running = 0
        self.busy_s = 0.0  # slot-seconds of work done (for utilisation and cost)
        self.cost = 0.0
        self.active: set[Any] = set()  # requests holding a slot here
        self.coord = Coord.origin(VIVALDI)
        # Last few adverts, newest last:
        # (seq, published_s, heard_s, queue, in_flight, coord, receivers that missed it).
        self.adverts: list[tuple[Any, ...]] = []
        self.adv_seq = 0
        self.adv_last = -1e18  # when the last advert was published
        self.adv_load = (-1, -1)  # (queue, in_flight) it announced
        self.adv_pending = False  # an early advert is scheduled
        self.adv_due = -1  # the timing-wheel tick of its next periodic advert
        self.sent: dict[int, list[float]] = {}  # peer idx -> send instants (recent)
        self.measured: dict[int, tuple[float, float]] = {}  # peer idx -> (rtt_ms, at_s)
        self.known_dead: set[int] | frozenset[int] = _NO_DEAD  # a set once one is found
        self.rr = 0  # round-robin counter: the World sets this node's own starting offset
        self.probe_at = -1e18
        self.probes: list[tuple[int, float, float, int, int, float]] = []
        self.probe_pending: list[tuple[int, float, float, int, int, float]] = []
        self.view_cache: dict[int, Any] | None = None
        self.rate = 0.0  # requests/s when saturated, as the node measures and gossips it
        self.nv: Any = None  # NodeView constructor with the static fields bound (views.py)
        self.nv_tail: tuple[Any, ...] = ()
        # its KV prefix cache (meshd.sim.prefixes; None: its hardware class keeps none)
        self.px = (NodePrefixes(hw.prefix_cache_tokens, keep_answers=hw.keep_answers)
                   if hw.prefix_cache_tokens > 0 else None)


class World:
    """Nodes, cells and the latency model of one run."""

    def __init__(self, scenario: Scenario, seed: int) -> None:
        self.scenario = scenario
        self.region_names = [r.name for r in scenario.regions]
        self.latency = LatencyModel(scenario.latency, self.region_names)
        self.models = {m.name: m.num_layers for m in scenario.models.values()}
        self.rng = random.Random(seed * 31 + 5)
        # Each node's round-robin counter starts at an offset of its own, as independent
        # balancers' would (a separate generator: the mesh itself does not change with it).
        self.rr_rng = random.Random(seed * 29 + 11)
        self.nodes: list[SimNode] = []
        self.by_peer: dict[str, int] = {}
        self.cells: list[list[int]] = []  # cell -> member idx sorted by peer id
        self.cell_region: list[int] = []
        self.region_cells: list[list[int]] = [[] for _ in self.region_names]
        self.region_alive: list[list[int]] = [[] for _ in self.region_names]  # entry candidates
        self._alive_pos: dict[int, int] = {}
        cell_size = scenario.gossip.cell_size
        for ri, region in enumerate(scenario.regions):
            specs = [(g.hardware, g.serve, g.labels) for g in region.groups for _ in range(g.count)]
            self.rng.shuffle(specs)  # cells mix hardware classes the way a real region would
            members = [self._add(ri, scenario.hardware[h], s, lab, 0.0) for h, s, lab in specs]
            ncell = max(1, -(-len(members) // cell_size))
            for c in range(ncell):
                self._new_cell(ri, members[c::ncell])
        self._warmup(scenario.vivaldi.warmup_rounds)

    def _add(self, region: int, hw: Hardware, serve: tuple[ServeSpec, ...],
             labels: frozenset[str], born_s: float) -> int:  # fmt: skip
        idx = len(self.nodes)
        self.latency.place(region, self.rng)
        node = SimNode(
            idx, region, self.region_names[region], hw, serve, self.models, labels, born_s
        )
        node.rr = self.rr_rng.getrandbits(31)
        self.nodes.append(node)
        self.by_peer[node.peer_id] = idx
        ra = self.region_alive[region]
        self._alive_pos[idx] = len(ra)
        ra.append(idx)
        return idx

    def _new_cell(self, region: int, members: list[int]) -> None:
        c = len(self.cells)
        for i in members:
            self.nodes[i].cell = c
        self.cells.append(sorted(members))
        self.cell_region.append(region)
        self.region_cells[region].append(c)

    def _warmup(self, rounds: int) -> None:
        """RTT samples a mesh that has been running a while would have: mostly cell peers."""
        rng = self.rng
        n = len(self.nodes)
        for _ in range(rounds):
            for node in self.nodes:
                cell = self.cells[node.cell]
                if rng.random() < 0.75 and len(cell) > 1:
                    j = cell[rng.randrange(len(cell))]
                else:
                    j = rng.randrange(n)
                if j != node.idx:
                    self.sample_rtt(node, self.nodes[j], rng)

    def sample_rtt(self, a: SimNode, b: SimNode, rng: random.Random) -> float:
        """``a`` measures an RTT to ``b`` and moves its coordinate; returns the sample."""
        rtt = self.latency.sample_ms(a.idx, b.idx, rng)
        a.coord = update(a.coord, b.coord, rtt, VIVALDI, rng)
        return rtt

    def join(self, region: int, hw: Hardware, serve: tuple[ServeSpec, ...], now: float) -> SimNode:
        """A node joins: the region's smallest cell takes it (a new cell if all are full)."""
        idx = self._add(region, hw, serve, frozenset(), now)
        node = self.nodes[idx]
        cells = self.region_cells[region]
        best = min(cells, key=lambda c: (len(self.cells[c]), c))
        if len(self.cells[best]) >= self.scenario.gossip.cell_size:
            self._new_cell(region, [idx])
        else:
            node.cell = best
            self.cells[best].append(idx)
            self.cells[best].sort()
        for _ in range(max(4, self.scenario.vivaldi.warmup_rounds // 2)):
            cell = self.cells[node.cell]
            j = cell[self.rng.randrange(len(cell))]
            if j != idx:
                self.sample_rtt(node, self.nodes[j], self.rng)
        return node

    def kill(self, idx: int, now: float) -> None:
        node = self.nodes[idx]
        node.alive = False
        node.died_s = now
        pos = self._alive_pos.pop(idx)
        ra = self.region_alive[node.region]
        last = ra.pop()
        if last != idx:
            ra[pos] = last
            self._alive_pos[last] = pos

    def purge(self, idx: int) -> None:
        """Forget a dead node once every view has expired it."""
        node = self.nodes[idx]
        cell = self.cells[node.cell]
        if idx in cell:
            cell.remove(idx)

    def memory_hint(self) -> dict[str, int]:
        return {"nodes": len(self.nodes), "cells": len(self.cells)}
