"""Showing results: a terminal table, CSV, JSON and a PNG comparing strategies."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import Any

from meshd.errors import LocalError

# (JSON key, column heading, format)
COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("ttft_p50_ms", "TTFT p50", "{:.0f}"),
    ("ttft_p95_ms", "p95", "{:.0f}"),
    ("ttft_p99_ms", "p99 ms", "{:.0f}"),
    ("e2e_p50_ms", "E2E p50", "{:.0f}"),
    ("e2e_p95_ms", "p95 ms", "{:.0f}"),
    ("throughput_rps", "req/s", "{:.1f}"),
    ("throughput_tps", "tok/s", "{:.0f}"),
    ("cost_per_1k_tokens", "$/1K tok", "{:.6f}"),
    ("energy_per_1k_tokens_j", "J/1K tok", "{:.0f}"),
    ("utilization_stddev", "util sd", "{:.3f}"),
    ("completed", "done", "{:d}"),
    ("failed", "failed", "{:d}"),
)


def _fmt(fmt: str, v: Any) -> str:
    if v is None or isinstance(v, float) and math.isnan(v):
        return "-"
    return fmt.format(v)


def table(results: dict[str, dict[str, Any]]) -> str:
    """A fixed-width table, one row per strategy."""
    head = ["strategy", *(h for _, h, _ in COLUMNS)]
    rows = [[name, *(_fmt(f, r[k]) for k, _, f in COLUMNS)] for name, r in results.items()]
    widths = [max(len(x[i]) for x in [head, *rows]) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))
             for row in [head, *rows]]  # fmt: skip
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def ratios(results: dict[str, dict[str, Any]], against: str = "round_robin") -> str:
    """meshd's figures as a fraction of another strategy's (the issue's acceptance ratios)."""
    if "meshd" not in results or against not in results:
        return ""
    m, o = results["meshd"], results[against]
    parts = []
    for key, label in (
        ("ttft_p95_ms", "p95"),
        ("ttft_p99_ms", "p99"),
        ("cost_per_1k_tokens", "cost"),
    ):
        if o[key] and not math.isnan(o[key]) and not math.isnan(m[key]):
            parts.append(f"{label} {m[key] / o[key]:.2f}x")
    return f"meshd vs {against}: " + ", ".join(parts)


def _scalars(r: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in r.items() if isinstance(v, int | float | str)}


def to_json(results: dict[str, dict[str, Any]]) -> str:
    def clean(v: Any) -> Any:
        if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
            return None
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        return v

    return json.dumps({k: clean(v) for k, v in results.items()}, indent=2, sort_keys=False)


def write_csv(results: dict[str, dict[str, Any]], path: str | None) -> str:
    """CSV with one row per strategy (scalar figures only); written to ``path`` if given."""
    keys: list[str] = []
    for r in results.values():
        for k in _scalars(r):
            if k not in keys:
                keys.append(k)
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["strategy", *keys])
    for name, r in results.items():
        w.writerow([name, *(r.get(k, "") for k in keys)])
    text = buf.getvalue()
    if path:
        Path(path).write_text(text, encoding="utf-8")
    return text


def plot(results: dict[str, dict[str, Any]], path: str, title: str) -> None:
    """Bars per strategy: TTFT percentiles (log scale), cost per 1K tokens, utilisation spread."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise LocalError(
            "--plot needs matplotlib, which is not installed (pip install 'meshd[plot]')"
        ) from None
    names = list(results)
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    x = range(len(names))
    width = 0.27
    for i, (key, label) in enumerate(
        (("ttft_p50_ms", "p50"), ("ttft_p95_ms", "p95"), ("ttft_p99_ms", "p99"))
    ):
        vals = [results[n][key] for n in names]
        axes[0].bar([p + (i - 1) * width for p in x], vals, width, label=label)
    axes[0].set_yscale("log")
    axes[0].set_ylabel("time to first token (ms)")
    axes[0].legend()
    axes[1].bar(list(x), [results[n]["cost_per_1k_tokens"] for n in names], color="tab:green")
    axes[1].set_ylabel("cost per 1K tokens ($)")
    axes[2].bar(list(x), [results[n]["utilization_stddev"] for n in names], color="tab:purple")
    axes[2].set_ylabel("utilisation std dev across nodes")
    for ax in axes:
        ax.set_xticks(list(x))
        ax.set_xticklabels(names, rotation=30, ha="right")
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_curve(points: list[tuple[float, dict[str, dict[str, Any]]]], path: str, title: str,
               xlabel: str, key: str = "ttft_p95_ms") -> None:  # fmt: skip
    """One line per strategy: ``key`` against a swept parameter (e.g. the advert interval)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise LocalError("plotting needs matplotlib (pip install 'meshd[plot]')") from None
    fig, ax = plt.subplots(figsize=(7, 4.2))
    names = list(points[0][1])
    for n in names:
        ax.plot([p for p, _ in points], [r[n][key] for _, r in points], marker="o", label=n)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(key.replace("_", " "))
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
