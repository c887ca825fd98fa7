"""Entry step "record": the request's end in the journal and the statistics, whatever it was.

Runs last for every admitted request, answered, failed, refused or cancelled, even when the
chain was cut short (``EntryChain.submit`` runs it shielded, after the others): the request
leaves this node's set in flight (``admit`` put it there), the outcome goes to the store
(``meshd explain`` reads it), the counters move, and every observer (the metrics endpoint) is
told once, with the final stats plus ``outcome`` ("ok" or the error code) and ``origin``. A
store or observer failure is logged and counted, never the client's problem.
"""

from __future__ import annotations

import logging
from typing import Any

from meshd.errors import ErrorCode
from meshd.node.entry.context import EntryContext, EntryNode
from meshd.store.protocol import Recorder

log = logging.getLogger(__name__)


async def record(ctx: EntryContext, node: EntryNode) -> None:
    """The request's end, as ``ctx`` says it (``cancelled``, ``error``, ``answer``); nothing for a
    request the admit step refused."""
    if not ctx.admitted:
        return
    rid = ctx.req.request_id
    state = node.entry_state
    state.in_flight.discard(rid)
    if ctx.cancelled:
        state.stats["cancelled"] += 1
    elif ctx.error is not None:
        state.stats["failed"] += 1
    else:
        state.stats["answered"] += 1
    code = "ok"
    if ctx.cancelled:
        code = ErrorCode.CANCELLED
    elif ctx.error is not None:
        code = str(getattr(ctx.error, "code", ErrorCode.INTERNAL))
    if code != "ok":
        node.stats["requests_failed"] += 1
    stats: dict[str, Any] = dict(ctx.answer) if ctx.answer is not None else (
        ctx.outcome.stats() if ctx.outcome is not None else {})
    if node.store is not None:
        try:
            _store(node.store, node.node_name, ctx, code, stats)
        except Exception:  # the journal must never cost the client its request
            node.stats["journal_errors"] = node.stats.get("journal_errors", 0) + 1
            log.exception("outcome write failed rid=%s", rid)
    event = {**stats, "request_id": rid, "outcome": code, "origin": ctx.req.origin,
             "model": ctx.model, "strategy": ctx.strategy, "client": ctx.req.client,
             **decisions(ctx)}
    for obs in state.observers:
        try:
            obs(event)
        except Exception:
            log.exception("request observer failed rid=%s", rid)


def decisions(ctx: EntryContext) -> dict[str, Any]:
    """What the semantic cache and the tier step decided, for observers (the web console's list
    of requests): ``cache_lookup`` is ``exact`` (the same prompt answered before), ``semantic``
    (a paraphrase), ``miss``, ``verify`` (computed, then compared) or None (not looked up);
    ``tier`` is ``{"tier", "wanted", "escalated", "lowered"}`` for a ``model = "auto"``
    request, else None."""
    cache = ctx.extra.get("cache")
    kind = None
    if cache is not None:
        got = cache[1]
        kind = str(getattr(got, "kind", "")) or None
        if kind == "hit":
            kind = "exact" if getattr(got, "reason", "") == "same prompt" else "semantic"
    tier = ctx.extra.get("tier")
    return {"cache_lookup": kind,
            "tier": {k: tier.get(k) for k in ("tier", "wanted", "escalated", "lowered")}
            if isinstance(tier, dict) else None}


def _store(store: Recorder, node_name: str, ctx: EntryContext, code: str,
           stats: dict[str, Any]) -> None:
    rid = ctx.req.request_id
    error = None if code == "ok" else (str(ctx.error) if ctx.error is not None else code)
    o = ctx.outcome
    payload: dict[str, Any] = {"error": error, "tokens": stats.get("tokens", 0)}
    if o is not None:
        payload.update(retries=o.retries, hedges=o.hedges)
    store.record_event(rid, "done" if code == "ok" else "failed", node=node_name, payload=payload)
    store.record_outcome(
        rid, ttft_ms=stats.get("ttft_ms"), tokens=stats.get("tokens", 0),
        tokens_per_s=stats.get("tokens_per_s"), served_by=stats.get("served_by") or None,
        route=stats.get("route") or [], error=error, retries=stats.get("retries", 0),
        hedges=stats.get("hedges", 0))
