"""Wait-bounded admission: the entry node says how long a request may queue, the server knows.

An entry node ranks candidates on queue figures that are up to an advert interval old, and every
other entry node is doing the same. The serving node, though, knows its own queue exactly: how
many requests wait and when each running one should finish. So meshd's default strategy sends
its first attempts with a bound, ``max_wait_ms``: the wait beyond which the entry node would
rather go to its next candidate. A server that cannot start the request within the bound
answers ``busy`` at once, with its own estimate of the wait, instead of queueing it; the entry
node moves on, one round trip later. Once the planned bounded attempts are spent, the request
goes to whichever is predicted sooner: the next candidate, or the refuser that reported the
shortest wait. A refuser's reported wait is exact, the next candidate's prediction is an advert
old, so going on is checked: the next candidate gets the refuser's wait as its bound, and if it
cannot beat it the request goes back to that refuser, without a bound (``after_refusals``).

Pure parts, used by the router's decision (``meshd.core.decide``), the request's machine after
it (``meshd.core.request_life``) and the serving node (``meshd.node.runner``, and the simulator's
``meshd.sim.admission``):

- ``wait_bounds``: the bound for each peer of a routing decision's order;
- ``after_refusals``: where an attempt goes after refusals, and with what bound;
- ``slot_wait_ms``: the server's estimate of how long a new request would wait for a slot.

See docs/routing.md, "Wait-bounded admission".
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from meshd.core.routing import RouteDecision
from meshd.core.snapshot import Policy

STRATEGIES_WITH_BOUNDS = ("meshd", "meshd_no_prefix")
# checked attempts (bounded by the best refuser's wait) after the planned bounded ones: each
# refusal costs one round trip, so after this many more the request goes back to the soonest
# refuser
CHECKED_ATTEMPTS = 2


def wait_bounds(decision: RouteDecision, policy: Policy) -> dict[str, float]:
    """``max_wait_ms`` for the first ``policy.wait_bound_attempts`` peers of ``decision.order``.

    The bound on peer ``i`` is what going on would cost: the predicted TTFT of peer ``i + 1``,
    never less than ``policy.wait_bound_min_ms``. Peers not in the result get no bound (the last
    one of the order always: there is nowhere left to go). Empty for strategies other than
    meshd's, so the published baselines run as published.
    """
    if decision.strategy not in STRATEGIES_WITH_BOUNDS or policy.wait_bound_attempts <= 0:
        return {}
    order = decision.order
    out: dict[str, float] = {}
    for i, peer in enumerate(order[: policy.wait_bound_attempts]):
        if i + 1 >= len(order):
            break
        nxt = decision.candidate(order[i + 1])
        going_on = nxt.predicted_ttft_ms if nxt is not None else None
        if going_on is None or not math.isfinite(going_on):
            going_on = policy.wait_bound_min_ms
        out[peer] = max(policy.wait_bound_min_ms, going_on)
    return out


def slot_wait_ms(
    now_s: float, finishes_s: Sequence[float], waiting: int, slots: int, service_ms: float
) -> float:
    """How long a request arriving now would wait for one of ``slots`` slots, in ms.

    ``finishes_s`` are the expected end times of the requests running now (seconds, the same
    clock as ``now_s``); ``waiting`` requests are queued ahead of the new one; ``service_ms`` is
    how long one request holds a slot. A free slot means no wait. Otherwise the new request
    takes the slot freed by the ``waiting + 1``-th completion: the running requests finish at
    their times, then each slot turns over every ``service_ms``.
    """
    slots = max(slots, 1)
    if len(finishes_s) < slots and waiting <= 0:
        return 0.0
    ends = sorted(max(f - now_s, 0.0) * 1000.0 for f in finishes_s)
    ends += [0.0] * (slots - len(ends))  # a free slot (the waiting ones take it first)
    ends.sort()
    rounds, k = divmod(max(waiting, 0), slots)
    if rounds and not math.isfinite(service_ms):
        return math.inf
    return ends[k] + rounds * max(service_ms, 0.0)


def back_to_refuser(next_predicted_ms: float | None, refused_ms: Sequence[float]) -> int | None:
    """The bounded attempts are over: which refuser to go back to (its index in
    ``refused_ms``, each the refuser's reported wait plus its RTT and prefill as the router saw
    them), or None to go on to the next candidate, predicted at ``next_predicted_ms`` (None when
    nothing was predicted there, or when there is no next candidate: then back to the soonest
    refuser). Ties go to the next candidate. The request's machine
    (``meshd.core.request_life``), in the daemon and the simulator alike, follows this rule."""
    if not refused_ms:
        return None
    k = min(range(len(refused_ms)), key=lambda i: refused_ms[i])
    if next_predicted_ms is not None and next_predicted_ms <= refused_ms[k]:
        return None
    return k


def after_refusals(
    next_predicted_ms: float | None, next_known_ms: float | None, refused_ms: Sequence[float],
    policy: Policy,
) -> tuple[int | None, float | None]:
    """The planned bounded attempts are over and ``refused_ms`` refused: where to go now.

    Returns ``(k, None)`` to go back to refuser ``k`` without a bound (``back_to_refuser``),
    or ``(None, bound)`` to go on to the next candidate with ``max_wait_ms = bound`` (None: no
    bound). Going on is checked while the refusals number fewer than the planned bounded
    attempts plus ``CHECKED_ATTEMPTS``: the bound is the best refuser's known time less the
    next candidate's own RTT and prefill (``next_known_ms``), so a candidate whose advert said
    it was free but is not refuses at once, and the request goes back to the refuser whose wait
    it knows, instead of queueing behind a stale advert (measured on the regions testnet: the
    slowest requests had been refused twice and then waited seconds on a node of another region
    predicted free). ``next_predicted_ms`` None: no next candidate."""
    k = back_to_refuser(next_predicted_ms, refused_ms)
    if k is not None or next_predicted_ms is None or not refused_ms:
        return k, None
    if len(refused_ms) >= policy.wait_bound_attempts + CHECKED_ATTEMPTS:
        # every check failed: the adverts are behind the mesh's load, and the soonest refuser's
        # wait is the best figure there is
        return back_to_refuser(None, refused_ms), None
    bound = min(refused_ms) - max(next_known_ms or 0.0, 0.0)
    return None, max(policy.wait_bound_min_ms, bound)
