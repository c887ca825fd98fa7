"""Rate sweeps on a testnet: how many requests/s a mesh sustains, and the batching comparison.

Pure helpers for ``benchmarks/bench_testnet.py --rates ... --compare-batching``: the same
scenario run with the engine's batch scheduler off (each request its own decode loop, the
pre-batching default of 2 slots per model) and on (the default 8), at the same absolute offered
rates, since the two meshes' capacities differ. Nothing here does I/O.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass

from meshd.testnet.scenario import Scenario

# a rate whose runs lost more than this share of their requests (errors, timeouts) is not
# sustained, whatever the p95 of the requests that did complete
MAX_FAILED_SHARE = 0.01
DOUBLING = 2.0


@dataclass(frozen=True)
class RatePoint:
    """One offered rate's outcome: the p95 TTFT of its completed requests (ms; None when none
    completed) and the share of its requests that failed."""

    rate_rps: float
    p95_ms: float | None
    failed_share: float = 0.0


def sustained_rate(points: list[RatePoint], factor: float = DOUBLING,
                   max_failed_share: float = MAX_FAILED_SHARE) -> tuple[float | None, str]:
    """The highest offered rate the mesh sustains before p95 TTFT reaches ``factor`` x its
    value at the lowest rate: walking up the rates, the last one before the first that reaches
    it (or loses more than ``max_failed_share`` of its requests). Returns (rate, why): rate None
    when even the lowest rate fails that test; ``why`` names the rate that stopped the walk, or
    says that every rate stayed under (the sweep did not reach the limit: a lower bound)."""
    pts = sorted(points, key=lambda p: p.rate_rps)
    if not pts:
        return None, "no rates"
    first = pts[0]
    if first.p95_ms is None or first.p95_ms <= 0 or first.failed_share > max_failed_share:
        return None, f"the lowest rate, {first.rate_rps:g} rps, failed or completed nothing"
    limit = factor * first.p95_ms
    best = first.rate_rps
    for p in pts[1:]:
        if p.p95_ms is None or p.failed_share > max_failed_share:
            return best, f"{p.rate_rps:g} rps lost {100 * p.failed_share:.0f}% of its requests"
        if p.p95_ms >= limit:
            return best, (f"{p.rate_rps:g} rps: p95 {p.p95_ms:.0f} ms >= {factor:g} x "
                          f"{first.p95_ms:.0f} ms")
        best = p.rate_rps
    return best, f"every rate stayed under {factor:g} x {first.p95_ms:.0f} ms (a lower bound)"


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b, or None when either is missing or b is 0."""
    if a is None or b is None or b == 0 or math.isnan(a) or math.isnan(b):
        return None
    return a / b


def with_batching(scenario: Scenario, batching: bool, max_concurrency: int) -> Scenario:
    """The scenario with every node's daemon at ``[engine] batching`` and every local model at
    ``max_concurrency`` slots (a model that sets its own keeps it only if this is 0)."""
    nodes = []
    for n in scenario.nodes:
        config = copy.deepcopy(n.config)
        config["engine"] = {**dict(config.get("engine") or {}), "batching": batching}
        models = tuple({**m, "max_concurrency": max_concurrency} if max_concurrency > 0 else dict(m)
                       for m in n.models)
        nodes.append(dataclasses.replace(n, config=config, models=models))
    return dataclasses.replace(scenario, nodes=tuple(nodes),
                               name=f"{scenario.name} (batching {'on' if batching else 'off'})")


__all__ = ["RatePoint", "ratio", "sustained_rate", "with_batching"]
