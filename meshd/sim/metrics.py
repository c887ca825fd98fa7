"""What one run measured, and the summary figures a comparison prints.

Latencies are kept as float arrays (8 bytes per request) and summarised with numpy at the end.
Cost is the cost of the capacity used: each slot-second of work costs the node's
``cost_per_hour / concurrency / 3600`` (work on requests that later failed counts too), divided
by the tokens (prompt and output) of completed requests. Utilisation of a node is its busy
slot-seconds over its slot-seconds alive during the measured window. Energy is accounted the
same way from the nodes' ``power_w`` (``meshd.core.energy.request_energy_j``: watts over the
slots, for each slot-second of work) and reported per 1K tokens next to cost.
"""

from __future__ import annotations

from array import array
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from meshd.core.energy import per_1k_tokens

FAIL_REASONS = ("busy", "dead", "timeout", "no_route", "no_entry", "unfinished")


@dataclass
class Metrics:
    ttft_ms: array[float] = field(default_factory=lambda: array("d"))
    pipeline_ttft_ms: array[float] = field(
        default_factory=lambda: array("d")
    )  # pipelined ones only
    e2e_ms: array[float] = field(default_factory=lambda: array("d"))
    arrived: int = 0  # measured requests only (arrived at or after the warm-up)
    completed: int = 0
    failed: Counter[str] = field(default_factory=Counter)
    tokens: int = 0  # prompt + output tokens of completed, measured requests
    output_tokens: int = 0
    retries: int = 0
    cross_cell: int = 0  # requests served outside the entry node's cell
    local: int = 0  # requests served by their entry node itself
    pipelined: int = 0
    hedges: int = 0  # hedge copies sent
    hedge_wins: int = 0  # ... whose first token came first
    wait_refusals: int = 0  # attempts a server refused at once for their wait bound
    served_by_hardware: Counter[str] = field(default_factory=Counter)

    def complete(self, ttft_s: float, e2e_s: float, prompt: int, output: int) -> None:
        self.completed += 1
        self.ttft_ms.append(ttft_s * 1000.0)
        self.e2e_ms.append(e2e_s * 1000.0)
        self.tokens += prompt + output
        self.output_tokens += output

    def fail(self, reason: str) -> None:
        self.failed[reason] += 1


def _pct(a: array[float], q: float) -> float:
    if len(a) == 0:
        return float("nan")
    return float(np.percentile(np.frombuffer(a, dtype=np.float64), q))


def summarise(
    m: Metrics,
    *,
    window_s: float,
    total_cost: float,
    utilisation: list[float],
    extra: dict[str, Any],
    total_energy_j: float | None = None,
) -> dict[str, Any]:
    """The figures ``meshd sim`` prints for one strategy (names are the JSON keys)."""
    util = np.asarray(utilisation, dtype=np.float64)
    ttft = np.frombuffer(m.ttft_ms, dtype=np.float64) if len(m.ttft_ms) else np.zeros(0)
    failed = sum(m.failed.values())
    out: dict[str, Any] = {
        "ttft_p50_ms": _pct(m.ttft_ms, 50),
        "ttft_p95_ms": _pct(m.ttft_ms, 95),
        "ttft_p99_ms": _pct(m.ttft_ms, 99),
        "ttft_mean_ms": float(ttft.mean()) if len(ttft) else float("nan"),
        "e2e_p50_ms": _pct(m.e2e_ms, 50),
        "e2e_p95_ms": _pct(m.e2e_ms, 95),
        "e2e_p99_ms": _pct(m.e2e_ms, 99),
        "throughput_rps": m.completed / window_s if window_s > 0 else 0.0,
        "throughput_tps": m.output_tokens / window_s if window_s > 0 else 0.0,
        "cost_per_1k_tokens": total_cost / (m.tokens / 1000.0) if m.tokens else float("nan"),
        # joules per 1K tokens from the nodes' power_w (None when no hardware class has one)
        "energy_per_1k_tokens_j": (per_1k_tokens(total_energy_j, m.tokens)
                                   if total_energy_j is not None and m.tokens else None),
        "utilization_mean": float(util.mean()) if len(util) else 0.0,
        "utilization_stddev": float(util.std()) if len(util) else 0.0,
        "arrived": m.arrived,
        "completed": m.completed,
        "failed": failed,
        "failed_by_reason": {r: m.failed.get(r, 0) for r in FAIL_REASONS if m.failed.get(r)},
        "retries": m.retries,
        "served_locally": m.local,
        "served_cross_cell": m.cross_cell,
        "pipelined": m.pipelined,
        "hedges": m.hedges,
        "hedge_wins": m.hedge_wins,
        "wait_refusals": m.wait_refusals,
        "served_by_hardware": dict(sorted(m.served_by_hardware.items())),
    }
    if m.pipeline_ttft_ms:
        out["pipeline_ttft_p50_ms"] = _pct(m.pipeline_ttft_ms, 50)
        out["pipeline_ttft_p95_ms"] = _pct(m.pipeline_ttft_ms, 95)
    out.update(extra)
    return out
