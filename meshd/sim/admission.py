"""Wait-bounded admission at a simulated server, as the daemon's runner does it (issue 4).

The entry node's side (which attempts carry a bound, where a refused request goes next) is the
request's machine, ``meshd.core.request_life``, with ``meshd.core.admission.after_refusals``, as
in the daemon. Here is the server's side: a server with no free slot computes its wait with
``slot_wait_ms`` from the running requests' end times and its queue; over the attempt's bound,
it answers at once (half a round trip back) with that wait instead of queueing the request.

Copies of a hedged request are never refused (the machine sends every attempt of a hedged
request without a bound; here a copy already in transit when the hedge went out is not refused
either: the daemon's server would refuse it, and its entry node drop it while the other copy runs).
"""

from __future__ import annotations

from meshd.core import predict
from meshd.core.admission import slot_wait_ms
from meshd.sim.request import SimRequest
from meshd.sim.world import SimNode


def refused_wait_ms(t: SimNode, r: SimRequest, now: float) -> float | None:
    """At a server with no free slot: its wait if that is over this attempt's bound, else None."""
    life = r.life
    if life.hedged:
        return None
    bound = life.bound_of(r.attempt)
    if bound is None:
        return None
    service_ms = predict.slot_s(r.effective_prompt, r.remaining_output - 1, t.prefill_tps, t.decode_tps) * 1e3
    wait = slot_wait_ms(now, [a.end_s for a in t.active], len(t.queue), t.slots, service_ms)
    return wait if wait > bound else None
