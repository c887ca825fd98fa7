"""benchmarks/bench_testnet_chat.py --merge: runs of other seeds become one figure, their ratios
to meshd_no_prefix taken per seed and their median over all seeds; runs that differ in more
than their seeds are refused (no daemons: synthetic run summaries)."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def chat() -> ModuleType:
    before = os.environ.get("MESHD_TESTNET_CACHE")
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        spec = importlib.util.spec_from_file_location("_bench_testnet_chat",
                                                      ROOT / "benchmarks" / "bench_testnet_chat.py")
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
        if before is None:  # the script sets it for its own testnets
            os.environ.pop("MESHD_TESTNET_CACHE", None)
        else:
            os.environ["MESHD_TESTNET_CACHE"] = before


def _run(path: Path, seed: int, meshd: tuple[float, float], base: tuple[float, float],
         requests: int = 1000, offered: float = 1.364) -> Path:
    def summary(name: str, p50: float, p95: float) -> dict[str, object]:
        return {"strategy": name, "submitted": 10, "completed": 10, "seed": seed,
                "ttft_ms": {"50": p50, "95": p95, "99": p95}}
    out = {"load": 0.7, "offered_rps": offered, "requests": requests, "max_tokens": 16,
           "chat": {"turns": 3}, "prefill_per_decode": 10.0, "emulated_model": True,
           "scenario": "regions-12.toml", "node_models": {}, "seeds": [seed],
           "command": f"... --seeds {seed}", "runs": [], "ratios": {},
           "per_seed": [[summary("meshd", *meshd), summary("meshd_no_prefix", *base)]]}
    path.write_text(json.dumps(out))
    return path


def test_seeds_merge_into_per_seed_ratios_and_their_median(chat: ModuleType,
                                                             tmp_path: Path) -> None:
    files = [_run(tmp_path / "1.json", 1, (400, 1200), (800, 2000)),
             _run(tmp_path / "2.json", 2, (300, 900), (1000, 1000)),
             _run(tmp_path / "3.json", 3, (600, 600), (1000, 1000), offered=1.32)]
    out = chat.merge(files)
    assert out["seeds"] == [1, 2, 3]
    assert out["ratios"]["meshd"]["p50_per_seed"] == [0.5, 0.3, 0.6]
    assert out["ratios"]["meshd"]["p50_median"] == 0.5
    assert out["ratios"]["meshd"]["p95_per_seed"] == [0.6, 0.9, 0.6]
    assert out["ratios"]["meshd"]["p95_median"] == 0.6
    assert [m["seeds"] for m in out["merged_from"]] == [[1], [2], [3]]
    # each run measured the capacity its load is a fraction of: the rate is kept per run
    assert [m["offered_rps"] for m in out["merged_from"]] == [1.364, 1.364, 1.32]
    assert "runs" not in out  # no pooled percentiles: the runs' JSON keeps no samples
    assert "0.5x" in chat.merged_report(out)


def test_runs_of_other_settings_or_the_same_seed_are_refused(chat: ModuleType,
                                                             tmp_path: Path) -> None:
    a = _run(tmp_path / "a.json", 1, (400, 1200), (800, 2000))
    with pytest.raises(ValueError, match="requests"):  # a setting; the rate offered may differ
        chat.merge([a, _run(tmp_path / "b.json", 2, (1, 1), (1, 1), requests=500)])
    with pytest.raises(ValueError, match="twice"):
        chat.merge([a, _run(tmp_path / "c.json", 1, (1, 1), (1, 1))])
