"""Model tiers: which model a ``model = "auto"`` request goes to (docs/tiers.md).

Models carry a tier in their manifest and adverts (``micro`` < ``small`` < ``large``, with a
relative quality figure and the context length). The entry node scores the prompt with the tier
classifier (P(complex), ``meshd.classify``), then this pure function picks the model:

1. the wanted tier: a policy pin for the client, else one for the prompt's class, else the
   classifier's: ``micro`` below the threshold, ``small`` below ``small_below`` (when set),
   ``large`` otherwise; no score (no classifier) means ``large``, the safe choice;
2. from the wanted tier upwards, the first tier with a model whose context fits the request and
   a node that serves it, passes the hard constraints (residency, busy queue, KV room; the
   router's own ``exclusion_reason``) and is predicted to give the first token within
   ``max_ttft_ms``; among several such models the one predicted fastest (then higher quality,
   then name);
3. never down, unless the request allows it (``allow_lower``): then the tiers below the
   wanted one are tried last, nearest first.

The daemon's entry step (``meshd.node.entry.tier``) and the simulator (``meshd.sim.loop``) call
this very function. Quotas are not decided here: ``meshd.core.decide`` applies them to the
chosen model's route as for any request.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from meshd.core.predict import load, predicted_ttft_ms, prefill_ms, queue_wait_ms, service_rate_rps
from meshd.core.routing import exclusion_reason
from meshd.core.snapshot import MeshSnapshot, NodeView, Policy, RouteRequest
from meshd.errors import RoutingError

TIERS = ("micro", "small", "large")  # cheapest first
AUTO = "auto"  # the model name that asks the entry node to choose


def tier_rank(tier: str) -> int:
    """0 for micro, 1 small, 2 large; raises ValueError for an unknown tier."""
    return TIERS.index(tier)


@dataclass(frozen=True, slots=True)
class ModelTier:
    """One model's tier as its manifest or its servers' adverts say."""

    model: str
    tier: str
    quality: float = 0.0  # relative quality figure (the large tier's best is about 1.0)
    context_length: int = 0  # tokens; 0: unknown


@dataclass(frozen=True, slots=True)
class TierPolicy:
    threshold: float = 0.5  # P(complex) at or above which micro is not enough
    small_below: float = 0.0  # P(complex) below which small is enough (0: no small band)
    max_ttft_ms: float = 5000.0  # a tier whose best predicted TTFT is above this is skipped
    pin_clients: Mapping[str, str] = field(default_factory=dict)  # client -> tier
    pin_classes: Mapping[str, str] = field(default_factory=dict)  # prompt class -> tier


@dataclass(frozen=True, slots=True)
class TierRequest:
    request_id: str
    score: float | None  # P(complex) from the classifier; None: no classifier
    prompt_class: str = "text"
    client: str = "local"
    prompt_tokens: int = 0
    max_tokens: int = 0
    residency: str | None = None
    allow_lower: bool = False


@dataclass(frozen=True, slots=True)
class TierOption:
    """One tier as the decision examined it."""

    tier: str
    model: str | None  # the best model of the tier, if one qualified
    predicted_ttft_ms: float | None
    nodes: int  # nodes that could take the request
    why: str


@dataclass(frozen=True, slots=True)
class TierChoice:
    model: str
    tier: str
    wanted: str
    score: float | None
    escalated: bool  # served by a higher tier than wanted
    lowered: bool  # served by a lower tier than wanted (the request allowed it)
    reasons: tuple[str, ...]
    options: tuple[TierOption, ...]


def wanted_tier(req: TierRequest, policy: TierPolicy) -> tuple[str, str]:
    """The tier the prompt needs, and why."""
    pin = policy.pin_clients.get(req.client)
    if pin is not None:
        return pin, f"client {req.client} is pinned to {pin}"
    pin = policy.pin_classes.get(req.prompt_class)
    if pin is not None:
        return pin, f"prompt class {req.prompt_class} is pinned to {pin}"
    if req.score is None:
        return "large", "no classifier score: large, the safe choice"
    s = req.score
    if s < policy.threshold:
        return "micro", f"score {s:.3f} < threshold {policy.threshold:.3f}"
    if s < policy.small_below:
        return "small", f"threshold {policy.threshold:.3f} <= score {s:.3f} < {policy.small_below:.3f}"
    return "large", f"score {s:.3f} >= threshold {policy.threshold:.3f}"


def choose_tier(
    req: TierRequest,
    catalogue: Mapping[str, ModelTier],
    snap: MeshSnapshot,
    policy: TierPolicy,
    route_policy: Policy,
) -> TierChoice:
    """The model for ``req`` (see the module's docstring). Raises ``RoutingError`` naming every
    tier's reason when no tiered model can take the request."""
    wanted, why = wanted_tier(req, policy)
    reasons = [why]
    w = tier_rank(wanted)
    order = list(TIERS[w:]) + (list(reversed(TIERS[:w])) if req.allow_lower else [])
    options: list[TierOption] = []
    for tier in order:
        opt = _examine(tier, req, catalogue, snap, policy, route_policy)
        options.append(opt)
        if opt.model is None:
            reasons.append(f"{tier}: {opt.why}")
            continue
        r = tier_rank(tier)
        if r > w:
            reasons.append(f"escalated {wanted} -> {tier}")
        elif r < w:
            reasons.append(f"lowered {wanted} -> {tier} (the request allows it)")
        reasons.append(f"{tier}: {opt.model}, predicted TTFT {opt.predicted_ttft_ms:.0f} ms "
                       f"on {opt.nodes} node(s)")
        skipped = [TierOption(t, None, None, 0, "not needed") for t in TIERS if t not in order]
        return TierChoice(opt.model, tier, wanted, req.score, r > w, r < w, tuple(reasons),
                          tuple(options + skipped))
    raise RoutingError(f"request {req.request_id}: no model tier can take it ({'; '.join(reasons[1:])})")


def _examine(
    tier: str, req: TierRequest, catalogue: Mapping[str, ModelTier], snap: MeshSnapshot,
    policy: TierPolicy, route_policy: Policy,
) -> TierOption:  # fmt: skip
    models = sorted((m for m in catalogue.values() if m.tier == tier), key=lambda m: m.model)
    if not models:
        return TierOption(tier, None, None, 0, "no model of this tier in the mesh")
    need = req.prompt_tokens + req.max_tokens
    best: tuple[float, float, str] | None = None
    nodes_best = 0
    seen_nodes = 0
    too_long: list[str] = []
    for m in models:
        if m.context_length and need > m.context_length:
            too_long.append(f"{m.model} ({m.context_length} < {need} tokens)")
            continue
        rreq = RouteRequest(request_id=req.request_id, model=m.model,
                            prompt_tokens=req.prompt_tokens, max_tokens=req.max_tokens,
                            residency=req.residency, client=req.client)
        ttfts = [node_ttft_ms(n, m.model, req.prompt_tokens, req.max_tokens)
                 for n in snap.nodes
                 if n.serves(m.model) is not None and exclusion_reason(rreq, n, route_policy) is None]
        seen_nodes += sum(1 for n in snap.nodes if n.serves(m.model) is not None)
        if not ttfts:
            continue
        key = (min(ttfts), -m.quality, m.model)
        if best is None or key < best:
            best, nodes_best = key, len(ttfts)
    if best is None:
        if too_long and not seen_nodes:
            return TierOption(tier, None, None, 0, "context too short: " + ", ".join(too_long))
        if not seen_nodes:
            return TierOption(tier, None, None, 0, "no node serving it is reachable")
        return TierOption(tier, None, None, 0,
                          f"all {seen_nodes} node(s) serving it are saturated or ruled out "
                          f"(residency, queue, KV room)")
    ttft = best[0]
    if ttft > policy.max_ttft_ms:
        return TierOption(tier, None, ttft, nodes_best,
                          f"best predicted TTFT {ttft:.0f} ms > max_ttft_ms {policy.max_ttft_ms:.0f}")
    return TierOption(tier, best[2], ttft, nodes_best, "chosen")


def node_ttft_ms(n: NodeView, model: str, prompt_tokens: int, max_tokens: int) -> float:
    """Predicted time to first token of a request at ``n`` (``meshd.core.predict``: the round
    trip, the queue wait at the node's service rate, the prefill), without the router's
    staleness correction: a tier check, not a route."""
    s = n.serves(model)
    if s is not None and s.prefill_ms_per_layer_token > 0.0:
        pre = prompt_tokens * s.prefill_ms_per_layer_token * s.num_layers
    else:
        pre = prefill_ms(prompt_tokens, n.prefill_tps)
    rate = n.service_rate_rps or service_rate_rps(
        n.max_concurrency, prompt_tokens, max_tokens, n.prefill_tps, n.decode_tps)
    wait = queue_wait_ms(load(n.queue_depth, n.in_flight, n.sent_since_advert), n.max_concurrency, rate)
    t = predicted_ttft_ms(n.rtt_ms, wait, pre)
    return t if math.isfinite(t) else math.inf
