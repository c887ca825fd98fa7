"""Exploratory (issue 15): an adaptive threshold whose prior is fitted on the tune split.

    PYTHONPATH=. .venv/bin/python scripts/cache_adaptive_fit.py [fp32|int8]

Per entry, P(correct | s) = sigmoid(k (s - t_e)) with t_e ~ N(mu, sd); (mu, sd, k) maximise the
marginal likelihood of the tune split's guard-passing pairs (grouped by anchor). A lookup is
served when the posterior predictive P(correct | s, the entry's observations) >= 1 - delta.
Judged like bench_cache.py's adaptive curve: each anchor learns from half of its pairs and is
judged on the other half, then the halves swap. Prints fixed-threshold points beside it, as
"threshold or delta: paraphrases served / near misses served".
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from meshd.cache.guards import guard  # noqa: E402
from meshd.embed import default_embedding_model, load_embedder  # noqa: E402

GRID = np.linspace(0.5, 1.05, 221)  # values of an entry's t_e


def sigmoid(x: Any) -> Any:
    return 1 / (1 + np.exp(-x))


def loglik(obs: list[tuple[float, bool]], k: float) -> np.ndarray:
    ll = np.zeros_like(GRID)
    for s, ok in obs:
        p = sigmoid(k * (s - GRID))
        ll += np.log(np.clip(p if ok else 1 - p, 1e-12, 1))
    return ll


def normal(mu: float, sd: float) -> np.ndarray:
    w = np.exp(-0.5 * ((GRID - mu) / sd) ** 2)
    return np.asarray(w / w.sum())


def main() -> None:
    text = (ROOT / "benchmarks/data/cache_pairs.jsonl").read_text()
    rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    emb = load_embedder(default_embedding_model(),
                        precision=sys.argv[1] if len(sys.argv) > 1 else "fp32")
    texts = sorted({r["a"] for r in rows} | {r["b"] for r in rows})
    vec = dict(zip(texts, emb.embed(texts), strict=True))
    for r in rows:
        r["s"] = float(vec[r["a"]] @ vec[r["b"]])
        r["g"] = guard(r["b"], r["a"])

    groups: dict[str, list[tuple[float, bool]]] = {}
    for r in rows:
        if r["split"] == "tune" and not r["g"]:
            groups.setdefault(r["a"], []).append((r["s"], r["same"]))
    best: tuple[float, float, float, float] | None = None
    for mu, sd, k in itertools.product(np.arange(0.70, 0.96, 0.01), (0.01, 0.02, 0.03, 0.05, 0.08),
                                       (30, 60, 100, 150, 250, 400)):
        prior = normal(mu, sd)
        total = sum(float(np.log((prior * np.exp(loglik(o, k))).sum())) for o in groups.values())
        if best is None or total > best[0]:
            best = (total, float(mu), sd, k)
    assert best is not None
    _, mu, sd, k = best
    print(f"fitted on tune: mu {mu:.2f} sd {sd} slope {k}")
    prior = normal(mu, sd)

    def p_correct(s: float, obs: list[tuple[float, bool]]) -> float:
        w = prior * np.exp(loglik(obs, k))
        return float((w / w.sum() * sigmoid(k * (s - GRID))).sum())

    def rates(split: str, served: set[int]) -> str:
        sub = [i for i, r in enumerate(rows) if r["split"] == split]
        pos = [i for i in sub if rows[i]["same"]]
        neg = [i for i in sub if not rows[i]["same"]]
        return (f"{sum(i in served for i in pos) / len(pos):.3f}/"
                f"{sum(i in served for i in neg) / len(neg):.3f}")

    def twofold(split: str, delta: float) -> set[int]:
        by_anchor: dict[str, list[int]] = {}
        for i, r in enumerate(rows):
            if r["split"] == split:
                by_anchor.setdefault(r["a"], []).append(i)
        served: set[int] = set()
        for n, ids in enumerate(by_anchor.values()):
            order = list(ids)
            np.random.default_rng(n).shuffle(order)
            halves = (order[::2], order[1::2])
            for train, test in ((halves[0], halves[1]), (halves[1], halves[0])):
                obs = [(rows[i]["s"], rows[i]["same"]) for i in train if not rows[i]["g"]]
                served |= {i for i in test
                           if not rows[i]["g"] and p_correct(rows[i]["s"], obs) >= 1 - delta}
        return served

    for split in ("tune", "test", "fresh"):
        fixed = [f"{t:.2f}:" + rates(split, {i for i, r in enumerate(rows) if r["split"] == split
                                             and r["s"] >= t and not r["g"]})
                 for t in (0.80, 0.82, 0.83, 0.84, 0.85, 0.86, 0.87, 0.88)]
        adaptive = [f"{d}:" + rates(split, twofold(split, d))
                    for d in (0.005, 0.01, 0.02, 0.05, 0.1, 0.2)]
        print(split, "\n  fixed   ", " ".join(fixed), "\n  adaptive", " ".join(adaptive))


if __name__ == "__main__":
    main()
