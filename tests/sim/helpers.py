"""A small scenario built in code, so tests can vary one setting at a time."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from meshd.sim.scenario import Scenario
from meshd.sim.scenario_parse import scenario_from_dict

SCENARIOS = Path(__file__).resolve().parents[2] / "testnet" / "scenarios"

LENGTHS = {
    "prompt_tokens": {"dist": "lognormal", "mean": 200, "sigma": 0.6, "min": 8, "max": 1024},
    "output_tokens": {"dist": "lognormal", "mean": 40, "sigma": 0.5, "min": 4, "max": 128},
}

BASE: dict[str, Any] = {
    "name": "unit",
    "sim": {"duration_s": 12.0, "drain_s": 20.0, "seed": 3, "timeout_s": 15.0},
    "gossip": {"advert_interval_s": 1.0, "cell_size": 8, "probes": 2},
    "vivaldi": {"warmup_rounds": 20},
    "hardware": [
        {
            "name": "gpu",
            "prefill_tps": 4000.0,
            "decode_tps": 40.0,
            "concurrency": 4,
            "max_queue": 16,
            "cost_per_hour": 0.5,
        },
        {
            "name": "cpu",
            "prefill_tps": 150.0,
            "decode_tps": 8.0,
            "concurrency": 1,
            "max_queue": 4,
            "cost_per_hour": 0.05,
        },
    ],  # fmt: skip
    "model": [{"name": "m", "num_layers": 8}],
    "region": [
        {
            "name": "a",
            "nodes": [
                {"hardware": "gpu", "count": 3, "serve": ["m"]},
                {"hardware": "cpu", "count": 5, "serve": ["m"]},
            ],
        },
        {
            "name": "b",
            "nodes": [
                {"hardware": "gpu", "count": 3, "serve": ["m"]},
                {"hardware": "cpu", "count": 5, "serve": ["m"]},
            ],
        },
    ],  # fmt: skip
    "latency": {"inter_region_ms": {"a/b": 60.0}},
    "arrivals": [
        {"region": "a", "model": "m", "process": "poisson", "rate_per_s": 6.0, **LENGTHS},
        {"region": "b", "model": "m", "process": "poisson", "rate_per_s": 6.0, **LENGTHS},
    ],
}


def scenario(**tables: Any) -> Scenario:
    """BASE with some top-level tables replaced or merged (dicts merge one level deep)."""
    data = copy.deepcopy(BASE)
    for k, v in tables.items():
        if isinstance(v, dict) and isinstance(data.get(k), dict):
            data[k] = {**data[k], **v}
        else:
            data[k] = v
    return scenario_from_dict(data, "unit.toml")
