"""Where one request runs: a pure decision over a ``MeshSnapshot`` (docs/routing.md).

``route(req, snap, policy, rng, rr_index)`` lists every node that serves the whole model
(``index.model_index``), marks the ones a hard constraint excludes, with the reason
(``constraints``), predicts each remaining node's time to first token (``prediction``), and
picks one by the policy's strategy (``strategies``). It returns a ``RouteDecision``: the chosen
peer first in ``order``, then the fallbacks in the order failover and hedging should try them.
If nothing qualifies it raises ``RoutingError`` naming why each node was excluded.

The daemon and the simulator call this very function (through ``meshd.core.decide``); it does
no I/O, reads no clock, and draws randomness only from the ``rng`` it is given, so a seeded run
decides the same every time.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from meshd.core.routing.candidate import Candidate
from meshd.core.routing.constraints import eligible, exclusion_reason, global_constraints
from meshd.core.routing.index import Ints, ModelIndex, Vec, _Columns, model_index
from meshd.core.routing.prediction import _predict, _Predictions
from meshd.core.routing.strategies import check_strategy, rank
from meshd.core.snapshot import MeshSnapshot, NodeView, Policy, RouteRequest
from meshd.errors import RoutingError


@dataclass(frozen=True, slots=True)
class RouteDecision:
    """The router's answer and its reasons.

    ``order`` holds peer ids: the chosen one first, then the fallbacks in the order failover and
    hedging should try them (at most ``policy.max_fallbacks``). ``candidates`` lists eligible
    nodes, best first (every peer in ``order``, and more up to ``policy.explain_limit``), then
    excluded ones (up to ``policy.explain_limit``); ``omitted`` counts the nodes serving the model
    that the list leaves out. ``constraints`` are the hard constraints that applied, in words.
    """

    request_id: str
    strategy: str
    candidates: tuple[Candidate, ...]
    order: tuple[str, ...]
    constraints: tuple[str, ...]
    omitted: int = 0

    @property
    def chosen(self) -> str:
        return self.order[0]

    def candidate(self, peer_id: str) -> Candidate | None:
        for c in self.candidates:
            if c.peer_id == peer_id:
                return c
        return None


def route(
    req: RouteRequest,
    snap: MeshSnapshot,
    policy: Policy,
    rng: random.Random,
    rr_index: int = 0,
) -> RouteDecision:
    """Choose the node that serves ``req`` and its fallbacks, by ``policy.strategy``."""
    check_strategy(policy.strategy)
    constraints = global_constraints(req, snap, policy)
    idx = model_index(snap, req.model)
    if not idx.nodes:
        raise RoutingError(
            f"request {req.request_id}: no node serves the whole of model {req.model!r}"
        )
    e = eligible(req, idx, policy)
    if len(e) == 0:
        excluded = [(n, exclusion_reason(req, n, policy) or "excluded") for n in idx.nodes]
        raise RoutingError(_nothing_qualifies(req, excluded))
    pr = _predict(req, idx, e, policy)
    n = len(e)
    want = max(policy.max_fallbacks + 1, 1)
    listed_n = max(policy.explain_limit, want)
    ranked, score = rank(pr, idx, policy, rng, rr_index, snap.local_peer_id, listed_n)
    ids = idx.ids
    if isinstance(e, np.ndarray):
        order = tuple([ids[i] for i in e[ranked[:want]].tolist()])
    else:
        order = tuple([ids[e[k]] for k in ranked[:want]])
    listed = _candidates(idx, pr, ranked, score)
    if n < len(idx.nodes) and policy.explain_limit > 0 and isinstance(e, np.ndarray) and e is idx.cols().free:
        # Only the busy nodes are out (see constraints._eligible_np): the same list for every
        # such request.
        listed.extend(_busy_listing(idx, idx.cols(), req, policy))
    elif n < len(idx.nodes) and policy.explain_limit > 0:
        # The first explain_limit excluded nodes, in index (peer id) order.
        if isinstance(e, np.ndarray):
            out = np.ones(len(idx.nodes), dtype=np.bool_)
            out[e] = False
            gone: list[int] = out.nonzero()[0][: policy.explain_limit].tolist()
        else:
            ok = set(e)
            gone = [j for j in range(len(idx.nodes)) if j not in ok][: policy.explain_limit]
        for j in gone:
            node = idx.nodes[j]
            listed.append(_excluded(node, exclusion_reason(req, node, policy) or "excluded"))
    omitted = len(idx.nodes) - len(listed)
    return RouteDecision(
        req.request_id, policy.strategy, tuple(listed), order, tuple(constraints), omitted
    )


def _take(v: Vec, ks: list[int] | Ints) -> list[float]:
    """``v`` at positions ``ks`` as Python floats."""
    if isinstance(v, np.ndarray):
        out: list[float] = v[ks].tolist()
        return out
    return [float(v[k]) for k in ks]


def _candidates(
    idx: ModelIndex, pr: _Predictions, ks: list[int], score: Vec | None
) -> list[Candidate]:
    """The eligible candidates at positions ``ks``, in that order."""
    if isinstance(pr.e, np.ndarray):
        at: list[int] | Ints = np.array(ks, dtype=np.intp)  # one conversion for every column
        nodes = [idx.nodes[i] for i in pr.e[at].tolist()]
    else:
        at = ks
        nodes = [idx.nodes[pr.e[k]] for k in ks]
    scores: list[float | None] = list(_take(score, at)) if score is not None else [None] * len(ks)
    energy: list[float | None] = (
        [None if j != j else j for j in _take(pr.energy, at)] if pr.energy is not None
        else [None] * len(ks)
    )
    if pr.cached is not None:  # nodes holding a prefix of the prompt: what it saves them
        held = [int(pr.cached[k]) for k in ks]
        inv = [idx.inv_pf[i] for i in (pr.e[at].tolist() if isinstance(pr.e, np.ndarray)
                                        else [pr.e[k] for k in ks])]
        return [
            Candidate(n.peer_id, n.name, t if math.isfinite(t) and t < 1e15 else None,
                      n.rtt_ms, n.rtt_source, w, p, sc, None, jpt, m,
                      float(m) * ipf if m else 0.0)
            for n, t, w, p, sc, jpt, m, ipf in zip(
                nodes, _take(pr.ttft, ks), _take(pr.wait, ks), _take(pr.prefill, ks), scores,
                energy, held, inv, strict=True)
        ]
    return [
        Candidate(
            n.peer_id,
            n.name,
            t if math.isfinite(t) and t < 1e15 else None,
            n.rtt_ms,
            n.rtt_source,
            w,
            p,
            sc,
            None,
            jpt,
        )  # fmt: skip
        for n, t, w, p, sc, jpt in zip(
            nodes,
            _take(pr.ttft, ks),
            _take(pr.wait, ks),
            _take(pr.prefill, ks),
            scores,
            energy,
            strict=True,
        )
    ]


def _busy_listing(idx: ModelIndex, cols: _Columns, req: RouteRequest,
                  policy: Policy) -> list[Candidate]:  # fmt: skip
    """The first ``explain_limit`` excluded nodes of a decision whose eligible set is
    ``cols.free``: busy nodes only, whose reason depends on nothing else (kept per limit)."""
    limit = policy.explain_limit
    got = cols.busy_memo.get(limit)
    if got is None:
        gone = (~cols.not_busy).nonzero()[0][:limit].tolist()
        got = cols.busy_memo[limit] = [
            _excluded(idx.nodes[j], exclusion_reason(req, idx.nodes[j], policy) or "excluded")
            for j in gone
        ]
    return got


def _excluded(n: NodeView, why: str) -> Candidate:
    return Candidate(n.peer_id, n.name, None, n.rtt_ms, n.rtt_source, 0.0, 0.0, None, why)


def _nothing_qualifies(req: RouteRequest, excluded: Sequence[tuple[NodeView, str]]) -> str:
    """One line: every node that serves the model and why it was excluded (grouped by reason)."""
    groups: dict[str, list[str]] = {}
    for n, why in excluded:
        groups.setdefault(why.split(" (")[0], []).append(n.name or n.peer_id)
    parts = []
    for reason, names in sorted(groups.items()):
        more = f" and {len(names) - 5} more" if len(names) > 5 else ""
        parts.append(f"{reason}: {', '.join(names[:5])}{more}")
    tagged = f" with residency {req.residency!r}" if req.residency is not None else ""
    if not excluded:
        return f"request {req.request_id}: no node serves model {req.model!r}{tagged}"
    return (
        f"request {req.request_id}: no node may serve model {req.model!r}{tagged}; "
        f"{len(excluded)} excluded ({'; '.join(parts)})"
    )


def hedge_deadline_ms(decision: RouteDecision, policy: Policy) -> float | None:
    """When to send a second copy to the next peer in ``order`` if no first token has come.

    ``max(policy.hedge_min_ms, policy.hedge_factor * predicted TTFT of the chosen peer)``, in ms
    after sending. None when hedging is off, there is no fallback, or nothing was predicted.
    """
    if policy.hedge_factor <= 0.0 or len(decision.order) < 2:
        return None
    c = decision.candidate(decision.chosen)
    if c is None or c.predicted_ttft_ms is None:
        return None
    return max(policy.hedge_min_ms, policy.hedge_factor * c.predicted_ttft_ms)
