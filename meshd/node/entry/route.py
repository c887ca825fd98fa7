"""Entry step "route": the pure decision (``meshd.core.decide.decide``) on a fresh snapshot.

The snapshot carries the requests this node has in flight per client (the quota reads them);
the decision is journaled for ``meshd explain``: every candidate with its prediction and
score, or the pipeline plan. No node (``RoutingError``, a quota refusal too) is kept as
``ctx.no_route``: the request's life begins with it (the execute step fails with it, unless the
cache's pending lookup answers first).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from meshd.core.decide import Decision, decide
from meshd.core.request import EntryRequest
from meshd.core.routing import RouteDecision
from meshd.core.snapshot import MeshSnapshot, Policy, RouteRequest
from meshd.errors import RemoteError, RoutingError
from meshd.node.entry.context import EntryContext, EntryNode
from meshd.store.protocol import Recorder


def policy_for(node: EntryNode, req: EntryRequest) -> Policy:
    """The node's policy, with the request's strategy when it names one."""
    if req.strategy and req.strategy != node.policy.strategy:
        return replace(node.policy, strategy=req.strategy)
    return node.policy


async def route(ctx: EntryContext, node: EntryNode) -> None:
    rr_index = node.entry_state.next_rr()
    req = ctx.req
    ctx.policy = policy = policy_for(node, req)
    ctx.route_req = rreq = RouteRequest(
        request_id=req.request_id, model=ctx.model, prompt_tokens=ctx.prompt_tokens,
        max_tokens=ctx.max_tokens, residency=req.residency, client=req.client,
        prompt_ids=tuple(ctx.prompt_ids),
    )
    snap = node.membership.snapshot()
    if policy.client_quota:  # the quota reads the requests in flight per client
        snap = _with_clients(snap, node.entry_state.client_in_flight)
    try:
        ctx.decision = decide(rreq, snap, policy, node.rng, rr_index,
                              pipeline_mode=req.pipeline, hedge=node.config.routing.hedge)
    except RoutingError as e:  # QuotaError too, with its own code
        ctx.no_route = RemoteError(str(e), e.code)
        return
    if node.store is not None and ctx.decision.route is not None:
        record_decision(node.store, ctx.decision.route, rreq, energy_weight=policy.energy_weight)


def _with_clients(snap: MeshSnapshot, in_flight: dict[str, int]) -> MeshSnapshot:
    """``snap`` with the requests in flight per client (its memo of indexes kept)."""
    out = replace(snap, client_in_flight=dict(in_flight))
    out.cache.update(snap.cache)
    return out


def record_decision(store: Recorder, decision: RouteDecision, req: RouteRequest, *,
                    energy_weight: float = 0.0) -> None:
    rec = decision_record(decision, req)
    names = {c["peer_id"]: c["name"] for c in rec["candidates"]}
    store.record_decision(
        req.request_id,
        strategy=rec["strategy"],
        candidates=rec["candidates"],
        constraints={"applied": rec["constraints"], "model": req.model,
                     "residency": req.residency, "client": req.client,
                     "prompt_tokens": req.prompt_tokens,
                     **({"energy_weight": energy_weight} if energy_weight else {})},
        chosen=names.get(decision.chosen, decision.chosen),
        order=[names.get(p, p) for p in rec["order"]],
    )


def decision_record(decision: RouteDecision, req: RouteRequest) -> dict[str, Any]:
    return {
        "strategy": decision.strategy,
        "model": req.model,
        "prompt_tokens": req.prompt_tokens,
        "residency": req.residency,
        "constraints": list(decision.constraints),
        "candidates": [
            {
                "name": c.name,
                "peer_id": c.peer_id,
                "predicted_ttft_ms": c.predicted_ttft_ms,
                "rtt_ms": c.rtt_ms,
                "rtt_source": c.rtt_source,
                "queue_wait_ms": c.queue_wait_ms,
                "prefill_ms": c.prefill_ms,
                "score": c.score,
                "excluded_by": c.excluded_by,
                "joules_per_token": c.joules_per_token,
                **({"prefix_tokens": c.prefix_tokens, "prefix_credit_ms": c.prefix_credit_ms}
                   if c.prefix_tokens else {}),
            }
            for c in decision.candidates
        ],
        "order": list(decision.order),
        "chosen": decision.chosen,
    }


__all__ = ["Decision", "decision_record", "policy_for", "route"]
