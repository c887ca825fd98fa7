"""Load sweeps: every strategy at several offered loads, against the best other strategy.

``at_load(sc, load)`` scales every arrival stream's rate so that the scenario offers ``load``
times its capacity (``meshd.sim.capacity``; the shape of each stream, bursts and swings, is
kept). ``run_sweep`` runs each (strategy, load) pair on the same mesh and seed, and the report
functions compare each strategy with the best *other* strategy at the same load: the yardstick
of docs/sim.md is ``meshd / min(other strategies)`` at p95 and p99, not a ratio to one chosen
baseline. ``round_robin_lockstep`` is never a yardstick (it is there to show a herd).
"""

from __future__ import annotations

import dataclasses
import math
import os
import random
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import numpy as np

from meshd.core import predict
from meshd.core.routing import LOCKSTEP
from meshd.errors import ConfigError, LocalError
from meshd.sim.capacity import capacity
from meshd.sim.runner import run_one
from meshd.sim.scenario import Scenario
from meshd.sim.workload import sample_length

Sweep = dict[float, dict[str, dict[str, Any]]]  # load -> strategy -> figures
RATIO_KEYS = ("ttft_p95_ms", "ttft_p99_ms")


def parse_loads(text: str) -> tuple[float, ...]:
    """``"0.1,0.5,0.9"`` -> (0.1, 0.5, 0.9); each a fraction of capacity in (0, 5]."""
    out: list[float] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            v = float(part)
        except ValueError:
            raise ConfigError(f"--sweep-load: {part!r} is not a number") from None
        if not 0.0 < v <= 5.0 or not math.isfinite(v):
            raise ConfigError(f"--sweep-load: {part} is not a load between 0 and 5")
        if v not in out:
            out.append(v)
    if not out:
        raise ConfigError("--sweep-load: no load given")
    return tuple(sorted(out))


def at_load(sc: Scenario, load: float, *, stretch: bool = False) -> Scenario:
    """``sc`` with every arrival rate scaled so that it offers ``load`` of its capacity.

    With ``stretch``, a load below the scenario's own runs longer (``duration_s`` times own
    load / ``load``), so that every point of a sweep has at least as many requests as the
    scenario itself: a p99 at 10% load is then no noisier than one at the scenario's load.
    """
    now = capacity(sc).load
    if not (now > 0.0 and math.isfinite(now)):
        raise ConfigError(f"{sc.file}: no arrivals, or no capacity for them: cannot scale the load")
    f = load / now
    arrivals = tuple(dataclasses.replace(a, rate_per_s=a.rate_per_s * f) for a in sc.arrivals)
    out = dataclasses.replace(sc, arrivals=arrivals)
    if stretch and load < now:
        run = dataclasses.replace(sc.run, duration_s=sc.run.duration_s * now / load)
        out = dataclasses.replace(out, run=run)
    return out


def floor_ms(sc: Scenario, samples: int = 50_000, seed: int = 7) -> dict[str, float]:
    """TTFT percentiles no router can beat: every request started at once, with no network, on
    the fastest prefill of any node serving its model whole (prompt / prefill_tps).

    The requests are drawn from the scenario's own size distributions, each stream in
    proportion to its rate. Where this floor is close to a baseline's figure, no router can be
    much better than that baseline (identical hardware at light load, say).
    """
    fastest: dict[str, float] = {}
    for region in sc.regions:
        for g in region.groups:
            for sv in g.serve:
                if sv.layer_start == 0 and sv.layer_end == sc.models[sv.model].num_layers:
                    tps = sc.hardware[g.hardware].prefill_tps
                    fastest[sv.model] = max(fastest.get(sv.model, 0.0), tps)
    total = sum(a.rate_per_s for a in sc.arrivals if a.model in fastest)
    if total <= 0.0:
        return {}
    rng = random.Random(seed)
    ms: list[float] = []
    for a in sc.arrivals:
        if a.model not in fastest:
            continue
        n = max(1, round(samples * a.rate_per_s / total))
        ms.extend(predict.prefill_ms(sample_length(a.prompt_tokens, rng), fastest[a.model])
                  for _ in range(n))
    v = np.asarray(ms)
    return {f"ttft_p{q}_ms": float(np.percentile(v, q)) for q in (50, 95, 99)}


def _worker(args: tuple[Scenario, str, int | None, float]) -> tuple[float, str, dict[str, Any]]:
    sc, strategy, seed, load = args
    return load, strategy, run_one(sc, strategy, seed)


def run_sweep(
    sc: Scenario,
    strategies: Sequence[str],
    loads: Sequence[float],
    *,
    seed: int | None = None,
    jobs: int = 1,
    progress: Callable[[str, float], None] | None = None,
) -> Sweep:
    """Figures of every strategy at every load (the same mesh, seed and request sizes); loads
    below the scenario's own run longer (``at_load(..., stretch=True)``)."""
    work = [(at_load(sc, x, stretch=True), s, seed, x) for x in loads for s in strategies]
    got: dict[tuple[float, str], dict[str, Any]] = {}
    if jobs <= 1 or len(work) == 1:
        for w in work:
            name = f"{w[1]}@{w[3]:g}"
            cb = (lambda f, name=name: progress(name, f)) if progress else None
            got[(w[3], w[1])] = run_one(w[0], w[1], seed, cb)
    else:
        # The heaviest runs (highest load) first, so that the pool ends together.
        todo = sorted(work, key=lambda w: -w[3])
        with ProcessPoolExecutor(max_workers=min(jobs, len(work), os.cpu_count() or 1)) as pool:
            for load, strategy, res in pool.map(_worker, todo):
                got[(load, strategy)] = res
                if progress:
                    progress(f"{strategy}@{load:g}", 1.0)
    return {x: {s: got[(x, s)] for s in strategies} for x in loads}


def best_other(at: dict[str, dict[str, Any]], strategy: str, key: str) -> tuple[str, float]:
    """The strategy other than ``strategy`` (and the lockstep strawman) with the lowest ``key``,
    and that value; ("", nan) when there is none."""
    best, value = "", math.nan
    for name, r in at.items():
        v = r.get(key, math.nan)
        if name in (strategy, LOCKSTEP) or v is None or math.isnan(v):
            continue
        if math.isnan(value) or v < value:
            best, value = name, v
    return best, value


def ratio(a: float, b: float) -> float:
    return a / b if b and not (math.isnan(a) or math.isnan(b)) else math.nan


def rows(sweep: Sweep) -> list[dict[str, Any]]:
    """One row per (strategy, load), with each strategy's p95 and p99 against the best other
    strategy at that load, and its cost against round_robin's."""
    out: list[dict[str, Any]] = []
    for load, at in sweep.items():
        rr_cost = at.get("round_robin", {}).get("cost_per_1k_tokens", math.nan)
        for name, r in at.items():
            row: dict[str, Any] = {"load": load, "strategy": name}
            for key in ("ttft_p50_ms", "ttft_p95_ms", "ttft_p99_ms", "cost_per_1k_tokens",
                        "completed", "failed"):  # fmt: skip
                row[key] = r.get(key, math.nan)
            for key in RATIO_KEYS:
                other, v = best_other(at, name, key)
                row[f"{key}_best_other"] = other
                row[f"{key}_vs_best_other"] = ratio(r[key], v)
            row["cost_vs_round_robin"] = ratio(r["cost_per_1k_tokens"], rr_cost)
            out.append(row)
    return out


def _f(v: Any, fmt: str) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return fmt.format(v)


def table(sweep: Sweep) -> str:
    """The sweep as a table: one row per (strategy, load)."""
    head = ["load", "strategy", "TTFT p50", "p95", "p99 ms", "$/1K tok", "failed",
            "p95/best other", "p99/best other", "cost/rr"]  # fmt: skip
    body = [
        [
            f"{r['load']:.2f}",
            r["strategy"],
            _f(r["ttft_p50_ms"], "{:.0f}"),
            _f(r["ttft_p95_ms"], "{:.0f}"),
            _f(r["ttft_p99_ms"], "{:.0f}"),
            _f(r["cost_per_1k_tokens"], "{:.6f}"),
            _f(r["failed"], "{:d}"),
            _f(r["ttft_p95_ms_vs_best_other"], "{:.2f}x"),
            _f(r["ttft_p99_ms_vs_best_other"], "{:.2f}x"),
            _f(r["cost_vs_round_robin"], "{:.2f}x"),
        ]  # fmt: skip
        for r in rows(sweep)
    ]
    widths = [max(len(x[i]) for x in [head, *body]) for i in range(len(head))]
    lines = [
        "  ".join(c.ljust(w) if i == 1 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))
        for row in [head, *body]
    ]  # fmt: skip
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def yardstick(
    sweep: Sweep, strategy: str = "meshd", floor: dict[str, float] | None = None
) -> list[str]:
    """One line per load: ``strategy`` against the best other strategy at p95 and p99, its cost
    against round_robin's, and (given ``floor_ms``) the lowest ratio any router could reach."""
    out: list[str] = []
    for load, at in sweep.items():
        if strategy not in at:
            continue
        m = at[strategy]
        parts = []
        for key, label in (("ttft_p95_ms", "p95"), ("ttft_p99_ms", "p99")):
            other, v = best_other(at, strategy, key)
            if other:
                parts.append(f"{label} {ratio(m[key], v):.2f}x {other}")
        rr = at.get("round_robin")
        if rr is not None and strategy != "round_robin":
            c = ratio(m["cost_per_1k_tokens"], rr["cost_per_1k_tokens"])
            if not math.isnan(c):
                parts.append(f"cost {c:.2f}x round_robin")
        if floor:
            lows = []
            for key, label in (("ttft_p95_ms", "p95"), ("ttft_p99_ms", "p99")):
                _, v = best_other(at, strategy, key)
                if key in floor and not math.isnan(v):
                    lows.append(f"{label} {ratio(floor[key], v):.2f}x")
            if lows:
                parts.append("floor/best other " + " ".join(lows))
        if parts:
            out.append(f"load {load:.2f}: {strategy} vs best other: " + ", ".join(parts))
    return out


def to_json(sweep: Sweep) -> dict[str, Any]:
    def clean(v: Any) -> Any:
        if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
            return None
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        return v

    return {
        "loads": list(sweep),
        "results": {f"{x:g}": {s: clean(r) for s, r in at.items()} for x, at in sweep.items()},
        "rows": [clean(r) for r in rows(sweep)],
    }


def plot(sweep: Sweep, path: str, title: str) -> None:
    """TTFT p50, p95, p99 (log scale) and cost per 1K tokens against load, a line per strategy."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise LocalError(
            "--plot needs matplotlib, which is not installed (pip install 'meshd[plot]')"
        ) from None
    loads = list(sweep)
    names = list(sweep[loads[0]])
    fig, axes = plt.subplots(1, 4, figsize=(18, 4.4))
    panels = (("ttft_p50_ms", "TTFT p50 (ms)"), ("ttft_p95_ms", "TTFT p95 (ms)"),
              ("ttft_p99_ms", "TTFT p99 (ms)"), ("cost_per_1k_tokens", "$ per 1K tokens"))  # fmt: skip
    for ax, (key, label) in zip(axes, panels, strict=True):
        for n in names:
            ys = [sweep[x][n].get(key, math.nan) for x in loads]
            style = {"linewidth": 2.5} if n == "meshd" else {"linewidth": 1.2}
            ax.plot(loads, ys, marker="o", label=n, **style)
        if key != "cost_per_1k_tokens":
            ax.set_yscale("log")
        ax.set_xlabel("offered load (fraction of capacity)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_csv(sweep: Sweep, path: str) -> None:
    import csv

    rs = rows(sweep)
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(list(rs[0]))
        for r in rs:
            w.writerow(list(r.values()))
