"""Wait-bounded admission, as the daemon does it (``meshd.core.admission``, issue 4).

For the strategies ``wait_bounds`` gives bounds to (meshd's), the first attempts of a request
carry ``max_wait_ms``. A server with no free slot computes its wait with ``slot_wait_ms`` from
the running requests' end times and its queue; over the bound, it answers at once (half a round
trip back) with that wait instead of queueing the request. The entry node moves on to the next
peer of the decision's order without counting an attempt; once the planned bounds are spent it
goes to whichever is predicted sooner, that peer (bounded by the best refuser's wait while
checks are left) or the refuser with the shortest reported wait (plus its RTT and prefill as the
router saw them), unbounded: ``meshd.core.admission.after_refusals``, as ``meshd.node.forward``
does.

Hedged copies carry no bound (the daemon bounds a copy sent to one of the first peers; the
difference is a hedge that would have been refused queueing instead).
"""

from __future__ import annotations

from collections.abc import Mapping

from meshd.core import predict
from meshd.core.admission import after_refusals, slot_wait_ms
from meshd.core.routing import RouteDecision
from meshd.sim.events import Sim
from meshd.sim.request import SimRequest
from meshd.sim.world import SimNode


def arm(sim: Sim, r: SimRequest, dec: RouteDecision, bounds: Mapping[str, float]) -> None:
    """After a decision: the bounds of its first peers (``Decision.wait_bounds``), and what the
    router predicted."""
    if not bounds:
        r.bounds = None
        return
    by_peer = sim.world.by_peer
    r.bounds = {by_peer[p]: ms for p, ms in bounds.items()}
    r.pred = {
        by_peer[c.peer_id]: (c.predicted_ttft_ms, c.predicted_ttft_ms - c.queue_wait_ms)
        for c in dec.candidates
        if c.predicted_ttft_ms is not None and c.excluded_by is None
    }
    r.refused = []


def refused_wait_ms(t: SimNode, r: SimRequest, now: float) -> float | None:
    """At a server with no free slot: its wait if that is over this attempt's bound, else None."""
    if r.bounds is None or r.family is not None:
        return None
    bound = r.bounds.get(r.server)
    if bound is None:
        return None
    service_ms = predict.slot_s(r.effective_prompt, r.remaining_output - 1, t.prefill_tps, t.decode_tps) * 1e3
    wait = slot_wait_ms(now, [a.end_s for a in t.active], len(t.queue), t.slots, service_ms)
    return wait if wait > bound else None


def next_target(sim: Sim, r: SimRequest, wait_ms: float, now: float) -> None:
    """The refusal reached the entry node: note it and send the request on."""
    bounds, refused = r.bounds, r.refused
    assert bounds is not None and refused is not None
    known = r.pred.get(r.server, (0.0, 0.0))[1] if r.pred else 0.0
    refused.append((wait_ms + known, r.server))
    if r.measured:
        sim.m.wait_refusals += 1
    dead = sim.world.nodes[r.entry].known_dead
    r.pos += 1
    while r.pos < len(r.order) and (r.order[r.pos] in dead or r.order[r.pos] in r.tried):
        r.pos += 1
    nxt = r.order[r.pos] if r.pos < len(r.order) else -1
    if nxt < 0 or nxt not in bounds:
        # The planned bounds are spent: the next peer, checked against the best refuser's wait,
        # or back to the refuser predicted sooner, unbounded.
        nxt_ms, nxt_known = r.pred.get(nxt, (None, 0.0)) if nxt >= 0 and r.pred else (None, 0.0)
        k, bound = after_refusals(nxt_ms, nxt_known, [ms for ms, _ in refused], sim.policy)
        if k is not None:
            best = refused[k][1]
            del refused[k]
            bounds.pop(best, None)
            r.tried.discard(best)
            r.order.insert(r.pos, best)
        elif bound is not None:
            bounds[nxt] = bound
    sim.send(r, now)
