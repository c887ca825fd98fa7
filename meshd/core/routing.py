"""Where one request runs: a pure decision over a ``MeshSnapshot`` (docs/routing.md).

``route(req, snap, policy, rng, rr_index)`` lists every node that serves the whole model, marks
the ones a hard constraint excludes (with the reason), predicts each remaining node's time to
first token, and picks one by the policy's strategy. It returns a ``RouteDecision``: the chosen
peer first in ``order``, then the fallbacks in the order failover and hedging should try them.
If nothing qualifies it raises ``RoutingError`` naming why each node was excluded.

The daemon and the simulator call this very function; it does no I/O, reads no clock, and draws
randomness only from the ``rng`` it is given, so a seeded run decides the same every time.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from meshd.core import predict
from meshd.core.snapshot import MeshSnapshot, NodeView, Policy, RouteRequest
from meshd.errors import ConfigError, RoutingError

STRATEGIES = ("meshd", "round_robin", "random", "least_queue", "latency_only", "lwsq")

# Reasons a node is excluded, in the order they are checked (the first that applies is shown).
EXCLUDED_TRIED = "already tried"
EXCLUDED_RESIDENCY = "residency"
EXCLUDED_HOPS = "hop limit"
EXCLUDED_BUSY = "busy"
EXCLUDED_KV = "kv cache full"


@dataclass(frozen=True, slots=True)
class Candidate:
    """One node that serves the model, as the router saw it.

    ``predicted_ttft_ms`` = ``rtt_ms`` + ``queue_wait_ms`` + ``prefill_ms`` (staleness corrected,
    the same model for every strategy, so hedging and ``meshd explain`` can use it). ``score`` is
    what the strategy ranked by (lower is better; None for round_robin and random).
    ``excluded_by`` names the hard constraint that ruled the node out, or is None.
    """

    peer_id: str
    name: str
    predicted_ttft_ms: float | None
    rtt_ms: float
    rtt_source: str
    queue_wait_ms: float
    prefill_ms: float
    score: float | None
    excluded_by: str | None


@dataclass(frozen=True, slots=True)
class RouteDecision:
    """The router's answer and its reasons.

    ``order`` holds peer ids: the chosen one first, then the fallbacks in the order failover and
    hedging should try them (at most ``policy.max_fallbacks``). ``candidates`` lists the eligible
    nodes best first (up to ``policy.explain_limit``, always including every peer in ``order``)
    and then the excluded ones; ``omitted`` counts eligible nodes left out of that list.
    ``constraints`` are the hard constraints that applied, in words.
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


def residency_allows(labels: frozenset[str], tag: str) -> bool:
    """Whether a node whose certificate carries ``labels`` may serve a request tagged ``tag``.

    Tags and labels are hierarchical with ``/``: a node labelled ``eu/de`` may serve requests
    tagged ``eu`` or ``eu/de``, a node labelled ``eu`` may not serve one tagged ``eu/de`` (it
    could be anywhere in the EU). A label may also be written ``residency:eu``.
    """
    for label in labels:
        lab = label.removeprefix("residency:")
        if lab == tag or lab.startswith(tag + "/"):
            return True
    return False


def whole_model_nodes(snap: MeshSnapshot, model: str) -> tuple[NodeView, ...]:
    """The nodes serving the whole of ``model``, sorted by peer id (memoised on the snapshot)."""
    key = ("whole", model)
    hit = snap.cache.get(key)
    if hit is None:
        hit = tuple(sorted((n for n in snap.nodes if n.serves(model)), key=lambda n: n.peer_id))
        snap.cache[key] = hit
    nodes: tuple[NodeView, ...] = hit
    return nodes


def _global_constraints(req: RouteRequest, snap: MeshSnapshot, policy: Policy) -> list[str]:
    """Constraints on the request as a whole; raises when one of them rules everything out."""
    applied: list[str] = []
    if policy.strategy not in STRATEGIES:
        raise ConfigError(
            f"unknown routing strategy {policy.strategy!r}; choose one of {', '.join(STRATEGIES)}"
        )
    if policy.model_allow:
        if req.model not in policy.model_allow:
            raise RoutingError(
                f"request {req.request_id}: model {req.model!r} is not in the allow-list "
                f"({', '.join(sorted(policy.model_allow))})"
            )
        applied.append(f"model {req.model} is allowed")
    quota = policy.client_quota.get(req.client)
    if quota is not None:
        used = snap.client_in_flight.get(req.client, 0)
        if used >= quota:
            raise RoutingError(
                f"request {req.request_id}: client {req.client!r} has {used} requests in flight, "
                f"its quota is {quota}"
            )
        applied.append(f"client {req.client} quota {used + 1}/{quota}")
    if req.residency is not None:
        applied.append(f"residency {req.residency}: only nodes whose labels allow it")
    if req.exclude:
        applied.append(f"excluding {len(req.exclude)} peer(s) already tried")
    if req.hops >= policy.max_hops:
        applied.append(f"hop limit reached ({req.hops}/{policy.max_hops}): local node only")
    return applied


def _exclusion(req: RouteRequest, n: NodeView, policy: Policy) -> str | None:
    if n.peer_id in req.exclude:
        return EXCLUDED_TRIED
    if req.residency is not None and not residency_allows(n.labels, req.residency):
        return f"{EXCLUDED_RESIDENCY} (labels do not allow {req.residency})"
    if req.hops >= policy.max_hops and not n.is_local:
        return f"{EXCLUDED_HOPS} ({req.hops}/{policy.max_hops})"
    queued = n.queue_depth + n.sent_since_advert
    if queued >= n.max_queue:
        return f"{EXCLUDED_BUSY} (queue {queued}/{n.max_queue})"
    if n.free_kv_tokens < req.prompt_tokens + req.max_tokens:
        return f"{EXCLUDED_KV} ({n.free_kv_tokens} free < {req.prompt_tokens + req.max_tokens})"
    return None


def _rate(n: NodeView, req: RouteRequest) -> float:
    if n.service_rate_rps > 0.0:
        return n.service_rate_rps
    return predict.service_rate_rps(
        n.max_concurrency, req.prompt_tokens, req.max_tokens, n.prefill_tps, n.decode_tps
    )


@dataclass(slots=True)
class _Row:
    """Working numbers for one eligible node."""

    node: NodeView
    rate: float
    load: float  # staleness-corrected load a new request finds
    wait: float
    prefill: float
    ttft: float
    cost: float
    score: float = 0.0


def _rows(req: RouteRequest, eligible: Sequence[NodeView], policy: Policy) -> list[_Row]:
    rates = [_rate(n, req) for n in eligible]
    adv = [float(n.queue_depth + n.in_flight) for n in eligible]
    total_rate = sum(r for r in rates if math.isfinite(r))
    # Mesh-typical load per unit of capacity: where stale queue figures revert to.
    per_rate = sum(adv) / total_rate if total_rate > 0.0 else 0.0
    rows: list[_Row] = []
    for n, rate, a in zip(eligible, rates, adv, strict=True):
        load = a
        if policy.stale_relax_factor > 0.0 and n.advert_age_s > 0.0 and math.isfinite(rate):
            relax = policy.stale_relax_factor * max(a, float(n.max_concurrency)) / rate
            load = predict.stale_load(a, per_rate * rate, n.advert_age_s, relax)
        load += n.sent_since_advert
        wait = predict.queue_wait_ms(load, n.max_concurrency, rate)
        pre = predict.prefill_ms(req.prompt_tokens, n.prefill_tps)
        svc = predict.service_time_ms(req.prompt_tokens, req.max_tokens, n.prefill_tps, n.decode_tps)
        cost = predict.request_cost(n.cost_per_hour, svc, n.max_concurrency)
        rows.append(_Row(n, rate, load, wait, pre, n.rtt_ms + wait + pre, cost))
    return rows


def _rank_key(r: _Row) -> tuple[float, str]:
    return (r.score, r.node.peer_id)


def _choose_meshd(rows: list[_Row], policy: Policy, rng: random.Random) -> _Row:
    """Sample among the best instead of taking the global minimum (see docs/routing.md)."""
    costs = [r.cost for r in rows if math.isfinite(r.cost)]
    mean_cost = sum(costs) / len(costs) if costs else 0.0
    for r in rows:
        penalty = policy.cost_weight_ms * r.cost / mean_cost if mean_cost > 0.0 else 0.0
        r.score = r.ttft + penalty
    best = min(r.score for r in rows)
    if not math.isfinite(best):
        return min(rows, key=lambda r: r.node.peer_id)
    slack = max(policy.pool_slack_ms, policy.pool_slack_frac * best)
    pool = [r for r in rows if r.score <= best + slack]
    weights = [r.rate if math.isfinite(r.rate) and r.rate > 0 else 1.0 for r in pool]
    if policy.softmax_temperature_ms > 0.0:
        t = policy.softmax_temperature_ms
        weights = [w * math.exp(-(r.score - best) / t) for w, r in zip(weights, pool, strict=True)]
        return rng.choices(pool, weights=weights, k=1)[0]
    d = max(policy.sample_d, 1)
    if d >= len(pool):
        return min(pool, key=_rank_key)
    picked: list[_Row] = []
    idx = list(range(len(pool)))
    w = list(weights)
    for _ in range(d):
        (i,) = rng.choices(range(len(idx)), weights=w, k=1)
        picked.append(pool[idx[i]])
        del idx[i], w[i]
    return min(picked, key=_rank_key)


def route(
    req: RouteRequest,
    snap: MeshSnapshot,
    policy: Policy,
    rng: random.Random,
    rr_index: int = 0,
) -> RouteDecision:
    """Choose the node that serves ``req`` and its fallbacks, by ``policy.strategy``."""
    constraints = _global_constraints(req, snap, policy)
    nodes = whole_model_nodes(snap, req.model)
    if not nodes:
        raise RoutingError(f"request {req.request_id}: no node serves the whole of model {req.model!r}")
    eligible: list[NodeView] = []
    excluded: list[tuple[NodeView, str]] = []
    for n in nodes:
        why = _exclusion(req, n, policy)
        if why is None:
            eligible.append(n)
        else:
            excluded.append((n, why))
    if not eligible:
        raise RoutingError(_nothing_qualifies(req, excluded))
    rows = _rows(req, eligible, policy)
    strategy = policy.strategy
    chosen: _Row
    if strategy == "round_robin" or strategy == "random":
        i = rr_index % len(rows) if strategy == "round_robin" else rng.randrange(len(rows))
        ranked = rows[i:] + rows[:i]
        for r in rows:
            r.score = math.nan
    else:
        if strategy == "meshd":
            chosen = _choose_meshd(rows, policy, rng)
        else:
            for r in rows:
                q = float(r.node.queue_depth + r.node.in_flight + r.node.sent_since_advert)
                if strategy == "least_queue":
                    r.score = q
                elif strategy == "latency_only":
                    r.score = r.node.rtt_ms
                else:
                    r.score = policy.lwsq_alpha * r.node.rtt_ms + policy.lwsq_beta * q
            chosen = min(rows, key=_rank_key_lq if strategy == "least_queue" else _rank_key)
        ranked = sorted(rows, key=_rank_key_lq if strategy == "least_queue" else _rank_key)
        ranked.remove(chosen)
        ranked.insert(0, chosen)
    order = tuple(r.node.peer_id for r in ranked[: policy.max_fallbacks + 1])
    limit = max(policy.explain_limit, len(order))
    listed = [_candidate(r) for r in ranked[:limit]]
    listed += [_excluded_candidate(n, why) for n, why in excluded[:limit]]
    omitted = max(len(ranked) - limit, 0) + max(len(excluded) - limit, 0)
    return RouteDecision(req.request_id, strategy, tuple(listed), order, tuple(constraints), omitted)


def _rank_key_lq(r: _Row) -> tuple[float, float, str]:
    return (r.score, r.node.rtt_ms, r.node.peer_id)


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _candidate(r: _Row) -> Candidate:
    n = r.node
    return Candidate(
        n.peer_id,
        n.name,
        _finite(r.ttft),
        n.rtt_ms,
        n.rtt_source,
        r.wait,
        r.prefill,
        None if math.isnan(r.score) else r.score,
        None,
    )


def _excluded_candidate(n: NodeView, why: str) -> Candidate:
    return Candidate(n.peer_id, n.name, None, n.rtt_ms, n.rtt_source, 0.0, 0.0, None, why)


def _nothing_qualifies(req: RouteRequest, excluded: Sequence[tuple[NodeView, str]]) -> str:
    """One line: every node that serves the model and why it was excluded (grouped by reason)."""
    groups: dict[str, list[str]] = {}
    for n, why in excluded:
        groups.setdefault(why.split(" (")[0], []).append(n.name or n.peer_id)
    parts = []
    for reason, names in sorted(groups.items()):
        shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        parts.append(f"{reason}: {shown}")
    return (
        f"request {req.request_id}: no node may serve model {req.model!r}; "
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
