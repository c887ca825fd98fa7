"""What a cell says of itself, which cells an entry node probes into, and whom it asks. Pure.

The simulator (``meshd.sim.views``) and the daemon (``meshd.node.cells``) call these very
functions, so the candidates a daemon's router sees are drawn the way the simulated ones are
(docs/gossip-at-scale.md):

* ``typical_wait_ms``: how long a typical request (``nominal`` prompt and output tokens) would
  wait for its first token on a node, RTT aside: the queue model of ``meshd.core.predict``;
* ``summarise_cell``: per model, a cell's ``k`` least-loaded members (best first) and the best
  wait, from its members' waits;
* ``rank_cells``: the cells worth probing, from their score (RTT to the cell plus its best
  wait): every cell within ``PROBE_SLACK_MS`` of the best, and at least the best ``4 * probes``;
* ``local_best_ms``: what the entry's own cell offers: the best RTT plus typical wait among its
  members serving the model whole (itself included, at RTT 0);
* ``worth_probing``: whether to probe at all: only when the best other cell's score beats what
  the entry's own cell offers (the best RTT plus typical wait of its members) by more than
  ``PROBE_SLACK_MS``. A cell with a free member answers locally and sends no probe;
* ``pick_probes``: ``probes`` cells drawn at random among those, and in each a node at random
  among the ones its summary names (among those the entry is already linked to, where there are
  any: a dial costs more than the probe); drawing, rather than taking the best, keeps a region's
  entry nodes from all probing (and then piling onto) the same few nodes.
"""

from __future__ import annotations

import random
from collections.abc import Container, Hashable, Iterable, Mapping, Sequence
from typing import TypeVar

from meshd.core import predict

PROBE_SLACK_MS = 50.0  # cells this close to the best one are equally worth probing
NOMINAL_TOKENS = (128, 64)  # (prompt, output) of a typical request, where nothing better is known

C = TypeVar("C", bound=Hashable)  # a cell (an index in the simulator, a name in the daemon)
K = TypeVar("K")  # a node (an index in the simulator, a peer id in the daemon)


def typical_wait_ms(queue_depth: int, in_flight: int, slots: int, prefill_tps: float,
                    decode_tps: float, nominal: tuple[int, int] = NOMINAL_TOKENS) -> float:
    """Queue wait plus prefill of a typical request on a node with this load and these speeds."""
    p, o = nominal
    rate = predict.service_rate_rps(slots, p, o, prefill_tps, decode_tps)
    load = predict.load(queue_depth, in_flight, 0)
    return predict.queue_wait_ms(load, slots, rate) + predict.prefill_ms(p, prefill_tps)


def summarise_cell(members: Iterable[tuple[float, K, Iterable[str]]], k: int
                   ) -> tuple[dict[str, list[K]], dict[str, float], float]:
    """From ``(wait_ms, node, models it serves whole)`` of a cell's live members: per model its
    ``k`` least-loaded nodes, best first (ties by node); per model the best wait; and the cell's
    best wait over all models (inf for a cell serving nothing)."""
    per_model: dict[str, list[tuple[float, K]]] = {}
    for w, j, models in members:
        for m in models:
            per_model.setdefault(m, []).append((w, j))
    top = {m: [j for _, j in sorted(v)[:k]] for m, v in per_model.items()}
    best_of = {m: min(v)[0] for m, v in per_model.items()}
    best = min(best_of.values(), default=float("inf"))
    return top, best_of, best


def rank_cells(scored: Iterable[tuple[float, C]], probes: int) -> list[C]:
    """The cells an entry node may probe into, best first, from ``(score, cell)`` pairs."""
    ordered = sorted(scored)
    least = max(4, 4 * probes)
    cut = ordered[0][0] + PROBE_SLACK_MS if ordered else 0.0
    return [c for i, (sc, c) in enumerate(ordered) if i < least or sc <= cut]


def local_best_ms(members: Iterable[tuple[float, float]]) -> float:
    """The best ``rtt_ms + wait_ms`` over ``(rtt_ms, wait_ms)`` of the members of the entry's own
    cell that serve the model whole and that the request's residency allows, as the entry node
    sees them (itself at RTT 0; each wait by ``typical_wait_ms``); inf when there are none. What
    ``worth_probing`` compares the other cells against, in the daemon (``meshd.node.cells``) and
    the simulator (``meshd.sim.views``) alike."""
    return min((rtt + wait for rtt, wait in members), default=float("inf"))


def worth_probing(local_best_ms: float, remote_scores: Iterable[float],
                  slack_ms: float = PROBE_SLACK_MS) -> bool:
    """Whether an entry node should probe other cells before routing a model its own cell
    serves: only when the best other cell's score (RTT to it plus its summary's best wait) is
    below ``local_best_ms`` (the best RTT plus typical wait among the members of its own cell,
    itself included) by more than ``slack_ms``. Otherwise no other cell can win the routing
    decision by more than the slack, and a probe would cost a round trip (and maybe a dial)
    for nothing. A model the cell does not serve has ``local_best_ms`` = inf: always."""
    best = min(remote_scores, default=float("inf"))
    return best + slack_ms < local_best_ms


def pick_probes(cells: Sequence[C], named: Mapping[C, Sequence[K]], probes: int,
                rng: random.Random, linked: Container[K] = ()) -> list[K]:
    """The nodes to ask for their load: ``probes`` cells drawn among ``cells`` (the entry's own
    cell left out by the caller), a node drawn among the ones each names; sorted, no repeats.

    ``linked``: nodes the entry already holds a connection to. Where a cell names some, the
    node is drawn among those: a probe to a new node costs a dial (a Noise handshake and an
    attestation on both sides, more CPU than the probe itself), and any node a summary names is
    among its cell's least loaded. The simulator passes none (it does not model connections)."""
    drawn = rng.sample(list(cells), min(probes, len(cells)))
    out = set()
    for c in drawn:
        pool = [j for j in named[c] if j in linked] or list(named[c])
        if pool:
            out.add(rng.choice(pool))
    return sorted(out)  # type: ignore[type-var]
