"""Entry step "tier": a request for ``model = "auto"`` gets its model here (docs/tiers.md).

The prompt is scored by the tier classifier (``meshd.node.tiering``: the sentence embedding and
cheap features, P(complex)); the pure decision (``meshd.core.tiers.choose_tier``, which the
simulator calls too) picks the cheapest tier predicted to handle it whose predicted TTFT is
acceptable, escalating when no node of that tier can take the request. The choice, with the
score, the features and the reasons, is journaled as the "tier" event (``meshd explain``, and
the ``tier`` key of its ``--json``); the answer says the model and tier. A request that names a
model, or names none while ``[tiers] default_auto`` is off, passes untouched.
"""

from __future__ import annotations

from typing import Any

from meshd.core.tiers import AUTO, TIERS, ModelTier, TierPolicy, TierRequest, choose_tier
from meshd.errors import ErrorCode, RemoteError, RoutingError
from meshd.node.entry.context import EntryContext, EntryNode
from meshd.node.entry.route import policy_for


def wants_auto(ctx: EntryContext, node: EntryNode) -> bool:
    model = ctx.req.model
    return model == AUTO or (model is None and node.config.tiers.default_auto)


async def tier(ctx: EntryContext, node: EntryNode) -> None:
    if not wants_auto(ctx, node):
        return
    tiering = node.tiering
    req = ctx.req
    catalogue = tier_catalogue(node)
    if not catalogue:
        raise RemoteError("model auto: no model of the mesh has a tier (set tier in a model's "
                          "manifest or in [[models]] tier; docs/tiers.md)", ErrorCode.NO_MODEL)
    text = prompt_text(req)
    scored, why_unscored = await tiering.score(text)
    t = node.config.tiers
    policy = TierPolicy(threshold=tiering.threshold, small_below=t.small_below,
                        max_ttft_ms=t.max_ttft_ms, pin_clients=t.pin_clients,
                        pin_classes=t.pin_classes)
    features = scored.features if scored is not None else None
    if features is None:
        from meshd.core.prompt_features import prompt_features

        features = prompt_features(text)
    treq = TierRequest(
        request_id=req.request_id, score=scored.score if scored is not None else None,
        prompt_class=features.prompt_class, client=req.client,
        prompt_tokens=max(1, len(text) // 4), max_tokens=req.wanted_tokens,
        residency=req.residency, allow_lower=bool(req.allow_lower_tier),
    )
    record: dict[str, Any] = {
        "score": None if treq.score is None else round(treq.score, 4),
        "threshold": round(policy.threshold, 4), "prompt_class": features.prompt_class,
        "features": features.named(), "classifier": tiering.state,
    }
    if why_unscored:
        record["unscored"] = why_unscored
    try:
        choice = choose_tier(treq, catalogue, node.membership.snapshot(), policy,
                             policy_for(node, req))
    except RoutingError as e:
        ctx.journal("tier", {**record, "model": None, "tier": None, "reasons": [str(e)]})
        raise RemoteError(str(e), e.code) from None
    ctx.model = choice.model
    record.update({
        "model": choice.model, "tier": choice.tier, "wanted": choice.wanted,
        "escalated": choice.escalated, "lowered": choice.lowered, "reasons": list(choice.reasons),
        "options": [{"tier": o.tier, "model": o.model, "nodes": o.nodes, "why": o.why,
                     "predicted_ttft_ms": None if o.predicted_ttft_ms is None
                     else round(o.predicted_ttft_ms, 1)} for o in choice.options],
    })
    ctx.extra["tier"] = record
    ctx.journal("tier", record)
    moved = (f", escalated from {choice.wanted}" if choice.escalated
             else f", lowered from {choice.wanted}" if choice.lowered else "")
    said = f"score {treq.score:.2f}" if treq.score is not None else f"no score: {why_unscored}"
    ctx.notes.append(f"model auto: {choice.model} (tier {choice.tier}{moved}; {said})")


def prompt_text(req: Any) -> str:
    if req.messages is not None:
        return "\n".join(str(m.get("content", "")) for m in req.messages)
    return str(req.prompt or "")


def tier_catalogue(node: EntryNode) -> dict[str, ModelTier]:
    """Every model with a known tier: this node's, then what the adverts say (first wins)."""
    out: dict[str, ModelTier] = {}
    for name, s in sorted(node.runner.models.items()):
        tier = getattr(s, "tier", "")
        if tier in TIERS and s.whole:
            out[name] = ModelTier(name, tier, float(getattr(s, "quality", 0.0)),
                                  node.runner.context_length(name) or 0)
    for e in node.membership.table.live():
        for m in e.advert.models:
            if m.tier in TIERS and m.name not in out:
                out[m.name] = ModelTier(m.name, m.tier, m.quality, m.context_length)
    return out
