"""Model tiers in the simulator (docs/tiers.md): ``model = "auto"`` arrivals get their model from
``meshd.core.tiers.choose_tier``, the daemon's own decision, at their entry node's view.

Each such arrival is complex with its stream's ``complex_share``; its classifier score is drawn
from the shipped classifier's held-out scores of its true class (``[tiers] scores =
"shipped"``: the error rate measured by scripts/train_tier_classifier.py), or is exact
(``"perfect"``). The stream's own random numbers decide both, in every mode, so all modes see
the same requests (common random numbers). Modes: ``tiered`` (meshd), ``all_large`` and
``all_micro`` (every auto request to the highest / lowest tier's model, the baselines).
"""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

from meshd.core.snapshot import MeshSnapshot, Policy
from meshd.core.tiers import TIERS, ModelTier, TierPolicy, TierRequest, choose_tier, tier_rank
from meshd.errors import ConfigError, RoutingError
from meshd.sim.scenario import Scenario

TIER_MODES = ("all_large", "all_micro", "tiered")
CLASSIFIER_META = Path(__file__).resolve().parents[1] / "data" / "classifier" / "complexity-v1.json"


def shipped_scores() -> tuple[float, dict[str, list[float]]]:
    """The shipped classifier's threshold and held-out scores per true class."""
    try:
        meta = json.loads(CLASSIFIER_META.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"{CLASSIFIER_META}: cannot read the classifier's figures ({e})") from None
    return float(meta["threshold"]), {k: list(v) for k, v in meta["heldout"]["scores"].items()}


class TierSim:
    """One run's tier choices and their tally."""

    def __init__(self, sc: Scenario, mode: str, route_policy: Policy) -> None:
        if mode not in TIER_MODES:
            raise ConfigError(f"unknown tier mode {mode!r}; choose from {', '.join(TIER_MODES)}")
        self.mode = mode
        self.route_policy = route_policy
        self.catalogue = {m.name: ModelTier(m.name, m.tier, m.quality, m.context_length)
                          for m in sc.models.values() if m.tier}
        t = sc.tiers
        if t.scores == "shipped":
            threshold, self.scores = shipped_scores()
        else:
            threshold, self.scores = 0.5, {"simple": [0.0], "complex": [1.0]}
        self.policy = TierPolicy(threshold=t.threshold or threshold, small_below=t.small_below,
                                 max_ttft_ms=t.max_ttft_ms)
        ranked = sorted(self.catalogue.values(), key=lambda m: (tier_rank(m.tier), -m.quality, m.model))
        self.lowest = ranked[0].model if ranked else ""
        self.highest = max(ranked, key=lambda m: (tier_rank(m.tier), m.quality)).model if ranked else ""
        self.models = sorted(self.catalogue)
        self.tally: Counter[str] = Counter()

    def draw(self, complex_share: float, rng: random.Random) -> tuple[bool, float]:
        """Whether the next request is complex, and its classifier score (two draws, always)."""
        is_complex = rng.random() < complex_share
        pool = self.scores["complex" if is_complex else "simple"]
        return is_complex, pool[int(rng.random() * len(pool)) % len(pool)]

    def choose(self, rid: int, snaps: dict[str, MeshSnapshot], is_complex: bool, score: float,
               prompt: int, output: int, residency: str | None, measured: bool) -> str | None:
        """The model of one auto request (None: no tier can take it, the request fails)."""
        if self.mode == "all_large":
            model = self.highest
        elif self.mode == "all_micro":
            model = self.lowest
        else:
            snap = merged(snaps)
            req = TierRequest(request_id=str(rid), score=score, prompt_tokens=prompt,
                              max_tokens=output, residency=residency)
            try:
                model = choose_tier(req, self.catalogue, snap, self.policy, self.route_policy).model
            except RoutingError:
                model = None
        if measured:
            kind = "complex" if is_complex else "simple"
            self.tally[kind] += 1
            self.tally[f"{kind}_{self.catalogue[model].tier if model else 'unrouted'}"] += 1
        return model

    def summary(self) -> dict[str, Any]:
        n_c = self.tally["complex"]
        down = sum(self.tally[f"complex_{t}"] for t in TIERS if t != "large")  # below large
        return {"mode": self.mode, "counts": dict(sorted(self.tally.items())),
                "complex_sent_down": down / n_c if n_c else 0.0,
                "threshold": self.policy.threshold}


def merged(snaps: dict[str, MeshSnapshot]) -> MeshSnapshot:
    """One snapshot with the nodes of several per-model snapshots (each node once)."""
    first = next(iter(snaps.values()))
    nodes = {n.peer_id: n for s in snaps.values() for n in s.nodes}
    return replace(first, nodes=tuple(nodes[k] for k in sorted(nodes)))


def table(results: dict[str, dict[str, Any]]) -> str:
    """The side-by-side table of docs/tiers.md."""
    base = results.get("all_large")
    lines = ["| mode | completed | p50 TTFT ms | p95 TTFT ms | p99 TTFT ms | cost / 1K tokens | "
             "p95 vs all-to-large | cost vs all-to-large | complex sent down |",
             "|---|---|---|---|---|---|---|---|---|"]
    for mode, r in results.items():
        rel95 = r["ttft_p95_ms"] / base["ttft_p95_ms"] if base else float("nan")
        relc = r["cost_per_1k_tokens"] / base["cost_per_1k_tokens"] if base else float("nan")
        lines.append(f"| {mode} | {r['completed']} | {r['ttft_p50_ms']:.0f} | {r['ttft_p95_ms']:.0f} "
                     f"| {r['ttft_p99_ms']:.0f} "
                     f"| ${r['cost_per_1k_tokens']:.6f} | {rel95:.2f}x | {relc:.2f}x "
                     f"| {r['tiers']['complex_sent_down'] * 100:.1f}% |")
    return "\n".join(lines)
