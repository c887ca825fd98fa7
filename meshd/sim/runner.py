"""Run one scenario under several strategies, or tier modes, and collect the figures.

Each strategy is one ``Simulation`` run on the same mesh, workload and failures (same seed).
Runs may go to worker processes (``jobs > 1``); the results do not depend on it.
``compare_tiers`` runs one strategy once per tier mode (``meshd.sim.tiers``).
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from meshd.core.routing import BASELINE_STRATEGIES, STRATEGIES
from meshd.errors import ConfigError
from meshd.sim.loop import Simulation
from meshd.sim.scenario import Scenario
from meshd.sim.tiers import TIER_MODES

DEFAULT_STRATEGIES = BASELINE_STRATEGIES  # round_robin_lockstep only when asked for

Progress = Callable[[str, float], None]


def check_strategies(names: Sequence[str]) -> tuple[str, ...]:
    out = []
    for n in names:
        n = n.strip()
        if not n:
            continue
        if n not in STRATEGIES:
            raise ConfigError(f"unknown strategy {n!r}; choose from {', '.join(STRATEGIES)}")
        if n not in out:
            out.append(n)
    if not out:
        raise ConfigError("no strategy to run")
    return tuple(out)


def _max_rss_mib() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return ru / 1024.0


def run_one(scenario: Scenario, strategy: str, seed: int | None = None,
            progress: Callable[[float], None] | None = None) -> dict[str, Any]:  # fmt: skip
    """One strategy; adds wall/CPU seconds and peak memory to the figures."""
    t0 = time.perf_counter()
    c0 = time.process_time()
    sim = Simulation(scenario, strategy, seed=seed)
    result = sim.run(progress)
    result["wall_s"] = time.perf_counter() - t0
    result["cpu_s"] = time.process_time() - c0
    result["max_rss_mib"] = _max_rss_mib()
    return result


def _worker(args: tuple[Scenario, str, int | None]) -> tuple[str, dict[str, Any]]:
    scenario, strategy, seed = args
    return strategy, run_one(scenario, strategy, seed)


def run_all(
    scenario: Scenario,
    strategies: Sequence[str],
    *,
    seed: int | None = None,
    jobs: int = 1,
    progress: Progress | None = None,
) -> dict[str, dict[str, Any]]:
    """Figures per strategy, in the order asked."""
    results: dict[str, dict[str, Any]] = {}
    if jobs <= 1 or len(strategies) == 1:
        for s in strategies:
            cb = (lambda f, s=s: progress(s, f)) if progress else None
            results[s] = run_one(scenario, s, seed, cb)
        return results
    jobs = min(jobs, len(strategies), os.cpu_count() or 1)
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        for name, res in pool.map(_worker, [(scenario, s, seed) for s in strategies]):
            results[name] = res
            if progress:
                progress(name, 1.0)
    return {s: results[s] for s in strategies}


def compare_tiers(sc: Scenario, seed: int | None = None, strategy: str = "meshd") -> dict[str, dict[str, Any]]:
    """One run per tier mode; figures keyed by mode."""
    out: dict[str, dict[str, Any]] = {}
    for mode in TIER_MODES:
        sim = Simulation(sc, strategy, seed=seed, tier_mode=mode)
        out[mode] = sim.run()
    return out
