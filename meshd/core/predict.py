"""Small pure formulas behind every prediction the router and the planner make.

Units are in the names: ``_ms`` milliseconds, ``_s`` seconds, ``_tps`` tokens per second,
``_rps`` requests per second. Speeds are the ones a node measures and gossips in its advert:
``prefill_tps`` and ``decode_tps`` are per request (one slot), ``service_rate_rps`` is how many
requests the whole node completes per second when saturated.

The queue model: a node has ``max_concurrency`` slots. A request arriving when ``n`` requests are
queued or running starts at once if ``n < slots``; otherwise it waits for ``n - slots + 1``
completions, which come at the node's service rate, so the expected wait is
``(n - slots + 1) / service_rate``. See docs/routing.md.

This is the one place these formulas are written: the router evaluates them in batch over its
column cache (``meshd.core.routing.prediction``, checked against these in the tests), the
planner, the simulator (its nodes' service times, its capacity estimate, its admission) and the
daemon's runner (its slot time) call them here.
"""

from __future__ import annotations

import math

MS_PER_S = 1000.0


def prefill_ms(prompt_tokens: int, prefill_tps: float) -> float:
    """Time to process the prompt (the first token comes at the end of it)."""
    if prompt_tokens <= 0:
        return 0.0
    if prefill_tps <= 0.0:
        return math.inf
    return prompt_tokens / prefill_tps * MS_PER_S


def uncached_tokens(prompt_tokens: int, cached_tokens: int) -> int:
    """Prompt tokens a node prefills when its KV prefix cache holds ``cached_tokens`` of them
    (meshd.core.prefix_names.matched_tokens): the rest, and always the last (whose logits give
    the first token)."""
    if prompt_tokens <= 0:
        return 0
    return prompt_tokens - min(max(cached_tokens, 0), prompt_tokens - 1)


def prefill_s(prompt_tokens: float, prefill_tps: float) -> float:
    """Seconds to process ``prompt_tokens`` at a known, positive ``prefill_tps``."""
    return prompt_tokens / prefill_tps


def decode_s(tokens_after_first: float, decode_tps: float) -> float:
    """Seconds to generate the tokens after the first at a known, positive ``decode_tps``."""
    return tokens_after_first / decode_tps


def slot_s(prompt_tokens: float, tokens_after_first: float, prefill_tps: float,
           decode_tps: float) -> float:  # fmt: skip
    """Seconds one slot is busy with a request (known speeds): prefill, then the tokens after
    the first. ``service_time_ms`` is the same in ms, with unknown speeds handled."""
    return prefill_s(prompt_tokens, prefill_tps) + decode_s(tokens_after_first, decode_tps)


def batched_decode_tps(batch_tps: tuple[float, ...] | list[float], batch: int,
                       decode_tps: float) -> float:
    """Tokens/s one stream decodes at while ``batch`` streams decode together on a node that
    batches (docs/engine.md, "Continuous batching").

    ``batch_tps`` is the node's measured aggregate decode tokens/s at batch sizes 1, 2, 4, ...
    (entry ``k`` is batch ``2**k``; 0 where not measured), as its advert carries it. Between two
    measured sizes the aggregate is linear in the batch size; past the largest it stays flat
    (the node is saturated: more streams share the same tokens/s); below the smallest, each
    stream gets that size's per-stream speed. Without a curve: ``decode_tps`` (one stream's
    speed, the unbatched model)."""
    pts = [(1 << k, tps) for k, tps in enumerate(batch_tps) if tps > 0.0]
    if not pts:
        return decode_tps
    b = max(int(batch), 1)
    if b <= pts[0][0]:
        return pts[0][1] / pts[0][0]
    if b >= pts[-1][0]:
        return pts[-1][1] / b
    for (b0, t0), (b1, t1) in zip(pts, pts[1:], strict=False):
        if b0 <= b <= b1:
            return (t0 + (t1 - t0) * (b - b0) / (b1 - b0)) / b
    return decode_tps  # unreachable: the points are sorted


def decode_ms_per_token(decode_tps: float) -> float:
    """Time between two generated tokens of one request."""
    if decode_tps <= 0.0:
        return math.inf
    return MS_PER_S / decode_tps


def service_time_ms(
    prompt_tokens: int, output_tokens: int, prefill_tps: float, decode_tps: float
) -> float:
    """How long one slot is busy with a request: its prefill plus all but its first token."""
    decode = (
        max(output_tokens - 1, 0) * decode_ms_per_token(decode_tps) if output_tokens > 1 else 0.0
    )
    return prefill_ms(prompt_tokens, prefill_tps) + decode


def service_rate_rps(
    max_concurrency: int,
    prompt_tokens: int,
    output_tokens: int,
    prefill_tps: float,
    decode_tps: float,
) -> float:
    """Requests per second a node completes when saturated, from its speeds (if not measured)."""
    t = service_time_ms(prompt_tokens, output_tokens, prefill_tps, decode_tps)
    return rate_from_service_ms(max_concurrency, t)


def rate_from_service_ms(max_concurrency: int, service_ms: float) -> float:
    """Requests per second ``max_concurrency`` slots complete, each busy ``service_ms`` per
    request (infinite when a request takes no time)."""
    if not service_ms > 0.0:
        return math.inf
    return max(max_concurrency, 1) * MS_PER_S / service_ms


def load(queue_depth: int, in_flight: int, sent_since_advert: int) -> int:
    """Requests a node holds that a new request would find: queued, running, and ours in transit."""
    return max(queue_depth, 0) + max(in_flight, 0) + max(sent_since_advert, 0)


def queue_wait_ms(load_requests: float, max_concurrency: int, service_rate: float) -> float:
    """Expected wait before a slot frees up for a new request.

    ``load_requests`` is what ``load`` returns (it may be fractional after the staleness
    correction); ``service_rate`` is the node's completions per second when saturated.
    """
    ahead = load_requests - max(max_concurrency, 1) + 1.0
    if ahead <= 0.0:
        return 0.0
    if service_rate <= 0.0:
        return math.inf
    return ahead / service_rate * MS_PER_S


def predicted_ttft_ms(rtt_ms: float, queue_wait: float, prefill: float) -> float:
    """Time to first token seen by the entry node: the round trip, the wait and the prefill."""
    return rtt_ms + queue_wait + prefill


def stale_load(advertised: float, target: float, advert_age_s: float, relax_s: float) -> float:
    """Expected load now, given a load advertised ``advert_age_s`` ago.

    Queues revert to the mesh's typical load: a node that looked idle two seconds ago has since
    been found by every other entry node, and a node with a long queue has drained some of it.
    The advertised value decays towards ``target`` with time constant ``relax_s`` (the node's
    own turnover time): ``target + (advertised - target) * exp(-age / relax)``. Load that we
    sent ourselves is known exactly and is added by the caller, not decayed.
    """
    if advert_age_s <= 0.0 or relax_s <= 0.0 or math.isinf(relax_s):
        return advertised
    w = math.exp(-advert_age_s / relax_s)
    return target + (advertised - target) * w


def cost_per_1k_tokens(cost_per_hour: float, tokens_per_s: float) -> float:
    """Price of 1,000 tokens on a node that produces ``tokens_per_s`` while costing ``cost_per_hour``."""
    if cost_per_hour <= 0.0:
        return 0.0
    if tokens_per_s <= 0.0:
        return math.inf
    return cost_per_hour / 3600.0 / tokens_per_s * 1000.0


def request_cost(cost_per_hour: float, service_ms: float, max_concurrency: int) -> float:
    """Price of one request: the node's hourly price over the slot-time the request occupies."""
    if cost_per_hour <= 0.0:
        return 0.0
    return cost_per_hour / 3600.0 * service_ms / MS_PER_S / max(max_concurrency, 1)
