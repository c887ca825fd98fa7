"""Energy: joules a request costs on a node, from the node's measured power (pure formulas).

A node that advertises a measured power draw ``power_w`` (NVML, RAPL or a Jetson's input rail:
``meshd.core.hwsignals``) spends it over all its slots, so a request that holds one of its
``max_concurrency`` slots for ``service_ms`` costs ``power_w * service_ms / 1000 /
max_concurrency`` joules, the way ``predict.request_cost`` prices it. With ``[routing]
energy_weight`` (ms of predicted TTFT worth one joule per generated token; 0 = off) meshd's
score adds ``energy_weight * (J/token here - the least J/token among the candidates)``; a node
that does not measure its power counts as the least efficient one that does. The simulator
accounts the energy it reports (J per 1K tokens) with ``request_energy_j`` too.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

MS_PER_S = 1000.0


def request_energy_j(power_w: float | None, service_ms: float, max_concurrency: float) -> float | None:
    """Joules a request holding one slot for ``service_ms`` costs (None: power not measured)."""
    if power_w is None or power_w < 0.0 or not math.isfinite(power_w):
        return None
    return power_w * max(service_ms, 0.0) / MS_PER_S / max(max_concurrency, 1)


def joules_per_token(
    power_w: float | None, service_ms: float, max_concurrency: float, output_tokens: int
) -> float | None:
    """Joules per generated token of such a request (None: power not measured)."""
    e = request_energy_j(power_w, service_ms, max_concurrency)
    return None if e is None else e / max(output_tokens, 1)


def per_1k_tokens(joules: float, tokens: int) -> float:
    """Joules per 1,000 tokens (NaN when no token was made)."""
    return joules / (tokens / 1000.0) if tokens > 0 else float("nan")


def filled(jpt: Sequence[float | None]) -> list[float]:
    """``jpt`` with unknown figures replaced by the largest known one (all 0 if none known)."""
    known = [x for x in jpt if x is not None]
    worst = max(known) if known else 0.0
    return [worst if x is None else x for x in jpt]


def energy_terms_ms(jpt: Sequence[float | None], energy_weight: float) -> list[float]:
    """meshd's energy term per candidate: ``energy_weight * (J/token - least J/token)`` in ms
    (unknown power: the largest known J/token; all zero when the weight is 0 or none is known)."""
    if energy_weight <= 0.0 or all(x is None for x in jpt):
        return [0.0] * len(jpt)
    full = filled(jpt)
    least = min(full)
    return [energy_weight * (x - least) for x in full]
