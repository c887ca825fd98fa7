"""The entry node's whole route decision, in one pure call.

``decide(req, snap, policy, rng, rr_index, *, pipeline_mode, hedge)`` answers, from a snapshot
of what this node has heard: run the request on one node (``Decision.route``: the chosen peer
and its fallback order, with the wait bound each early attempt carries and the hedge deadline),
or as a pipeline of stage nodes (``Decision.plan``). The daemon's entry chain
(``meshd.node.entry.route``) and the simulator (``meshd.sim.loop``) call this very function, so
what the simulator measures is what the daemon does.

Order of the checks, each with the reason it adds to ``Decision.reasons``:

1. the client's quota of requests in flight (``routing.quota_constraint``);
2. pipeline or one node (``choose_pipeline``): the planner decides when no node serves the whole
   model, or when a chain is predicted to finish sooner; ``"never"``/``"always"`` force it;
3. one node: the router's strategy (``routing.route``), then the wait bounds of meshd's
   admission (``admission.wait_bounds``) and the hedge deadline (``routing.hedge_deadline_ms``).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field

from meshd.core.admission import wait_bounds
from meshd.core.planner import Plan, plan
from meshd.core.routing import RouteDecision, hedge_deadline_ms, quota_constraint, route
from meshd.core.snapshot import MeshSnapshot, Policy, RouteRequest
from meshd.errors import ProtocolError, RoutingError

PIPELINE_MODES = ("auto", "never", "always")


@dataclass(frozen=True, slots=True)
class Decision:
    """Where a request goes. Exactly one of ``route`` (one node, with fallbacks) and ``plan``
    (a pipeline of two or more stages, or one stage when forced) is set."""

    strategy: str
    route: RouteDecision | None = None
    plan: Plan | None = None
    wait_bounds: Mapping[str, float] = field(default_factory=dict)  # peer id -> max_wait_ms
    hedge_ms: float | None = None  # send a second copy if no first token by then
    reasons: tuple[str, ...] = ()

    @property
    def is_pipeline(self) -> bool:
        return self.plan is not None


def decide(
    req: RouteRequest,
    snap: MeshSnapshot,
    policy: Policy,
    rng: random.Random,
    rr_index: int = 0,
    *,
    pipeline_mode: str | None = None,
    hedge: bool = True,
) -> Decision:
    """The route of ``req`` (see the module's docstring). Raises ``RoutingError`` when no node
    may serve it (the message says why), ``ProtocolError`` for an unknown pipeline mode."""
    reasons: list[str] = []
    quota = quota_constraint(req, snap, policy)
    if quota is not None:
        reasons.append(quota)
    p = choose_pipeline(req, snap, policy, pipeline_mode)
    if p is not None:
        reasons.append(f"pipeline: {p.reason}")
        return Decision(policy.strategy, plan=p, reasons=tuple(reasons))
    r = route(req, snap, policy, rng, rr_index)
    reasons.extend(r.constraints)
    hedge_ms = hedge_deadline_ms(r, policy) if hedge else None
    return Decision(policy.strategy, route=r, wait_bounds=wait_bounds(r, policy),
                    hedge_ms=hedge_ms, reasons=tuple(reasons))


def choose_pipeline(
    req: RouteRequest, snap: MeshSnapshot, policy: Policy, mode: str | None = None
) -> Plan | None:
    """The plan to run as a pipeline, or None to route the request to one whole-model node.

    ``mode``: ``"auto"`` (default) follows the planner; ``"never"`` never pipelines;
    ``"always"`` runs through the stage protocol even when a whole-model node would win: the
    best chain of two or more stages if there is one, else the planner's single node as a
    one-stage pipeline (benchmarks compare the two this way). Raises ``RoutingError`` (naming
    the uncovered layers) when no node serves the whole model and no chain covers it.
    """
    mode = mode or "auto"
    if mode not in PIPELINE_MODES:
        raise ProtocolError(f"pipeline must be one of {', '.join(PIPELINE_MODES)}, not {mode!r}")
    if mode == "never":
        return None
    if mode == "auto" and whole_only(snap, req.model):
        return None  # what planning would answer, without its cost (see ``whole_only``)
    try:
        p = plan(req, snap, policy)
    except RoutingError:
        if any(n.serves(req.model) is not None for n in snap.nodes):
            return None  # the router explains why no whole-model node qualifies
        raise  # the planner's message names the layers nobody serves
    if p.is_pipeline or mode != "always":
        return p if p.is_pipeline else None
    alt = next((a for a in p.alternatives if a.is_pipeline), None)
    return alt if alt is not None else p


def whole_only(snap: MeshSnapshot, model: str) -> bool:
    """True when some node serves ``model`` and every node serving any of its layers serves all
    of them. Then ``choose_pipeline`` in ``"auto"`` mode answers None without planning, and
    planning would answer the same: every stage range the planner considers covers the whole
    model, so it has no chain of two or more stages to offer (its best plan is one node), and
    if it raises ``RoutingError`` a node serving the whole model exists, so the request goes to
    the router. The check reads each node's serving list once, where a plan prices every
    candidate; memoised in the snapshot's cache."""
    key = ("pipeline.whole_only", model)
    hit = snap.cache.get(key)
    if hit is not None:
        return bool(hit)
    any_range = False
    only = True
    for n in snap.nodes:
        for s in n.serving:
            if s.model == model:
                any_range = True
                if not s.whole:
                    only = False
                    break
        if not only:
            break
    snap.cache[key] = result = any_range and only
    return result
