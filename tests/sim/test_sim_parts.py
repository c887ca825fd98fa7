"""The simulator's small parts: arrivals, lengths, latency model, hedging, gossip accounting, CLI."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

import pytest

from meshd.cli.main import main
from meshd.core.advert import significant_load_change
from meshd.sim.latency import LatencyModel
from meshd.sim.loop import Simulation
from meshd.sim.scenario import ArrivalSpec, LatencySettings, LengthDist
from meshd.sim.workload import ArrivalStream, mean_length, sample_length

from .helpers import BASE, SCENARIOS, scenario

FIXED = LengthDist("fixed", 10)


@pytest.mark.parametrize(
    ("process", "extra"),
    [
        ("poisson", {}),
        ("bursty", {"burst_factor": 4.0, "burst_mean_s": 2.0, "calm_mean_s": 8.0}),
        ("diurnal", {"period_s": 50.0, "amplitude": 0.8}),
    ],
)
def test_arrival_processes_keep_their_mean_rate(process: str, extra: dict) -> None:
    spec = ArrivalSpec("a", "m", process, 20.0, FIXED, FIXED, **extra)
    s = ArrivalStream(spec, 0, seed=5)
    n, horizon = 0, 2000.0
    while s.next_time() <= horizon:
        n += 1
    assert n / horizon == pytest.approx(20.0, rel=0.06)


def test_bursty_is_burstier_than_poisson() -> None:
    def counts(process: str) -> list[int]:
        spec = ArrivalSpec("a", "m", process, 20.0, FIXED, FIXED, burst_factor=6.0)
        s = ArrivalStream(spec, 0, seed=2)
        c = [0] * 400
        while (t := s.next_time()) < 400:
            c[int(t)] += 1
        return c

    def var(c: list[int]) -> float:
        m = sum(c) / len(c)
        return sum((x - m) ** 2 for x in c) / len(c)

    assert var(counts("bursty")) > 3 * var(counts("poisson"))


def test_lengths_clamp_and_keep_their_mean() -> None:
    d = LengthDist("lognormal", mean=100, sigma=0.8, low=8, high=100000)
    assert mean_length(d) == pytest.approx(100, rel=0.05)
    rng = random.Random(1)
    clamped = LengthDist("lognormal", mean=100, sigma=2.0, low=50, high=60)
    assert all(50 <= sample_length(clamped, rng) <= 60 for _ in range(500))
    assert sample_length(LengthDist("uniform", low=3, high=3), rng) == 3


def test_latency_model_is_symmetric_and_in_range() -> None:
    cfg = LatencySettings(intra_region_ms=(5.0, 20.0), access_ms=(0.0, 0.0), jitter_ms=0.0,
                          inter_region_ms={("a", "b"): 80.0, ("b", "a"): 80.0})  # fmt: skip
    lat = LatencyModel(cfg, ["a", "b"])
    rng = random.Random(3)
    nodes = [lat.place(i % 2, rng) for i in range(40)]
    for x in nodes:
        for y in nodes:
            r = lat.rtt_ms(x, y)
            assert r == lat.rtt_ms(y, x)
            if x == y:
                assert r == 0.0
            elif lat.region[x] == lat.region[y]:
                assert 5.0 <= r <= 20.0
            else:
                assert r == 80.0


@pytest.mark.parametrize(
    ("old", "new", "want"),
    [
        ((-1, -1), (0, 0), True),  # nothing published yet
        ((0, 3), (0, 3), False),
        ((0, 3), (0, 4), False),  # one request of change
        ((0, 3), (1, 4), True),
        ((0, 0), (0, 1), True),  # leaving idle
        ((0, 1), (0, 0), True),  # becoming idle
    ],
)
def test_significant_change_rule(old: tuple, new: tuple, want: bool) -> None:
    assert significant_load_change(old, new) is want


def test_hedging_sends_copies_and_counts_requests_once() -> None:
    sc = scenario(policy={"hedge_factor": 1.0, "hedge_min_ms": 5.0})
    r = Simulation(sc, "round_robin").run()
    assert r["hedges"] > 0
    assert r["completed"] + r["failed"] == r["arrived"]
    off = Simulation(scenario(policy={"hedge_factor": 0.0}), "round_robin").run()
    assert off["hedges"] == 0


def test_gossip_accounting_is_bounded_by_the_cell() -> None:
    r = Simulation(scenario(), "meshd").run()
    g = scenario().gossip
    # Each node hears at most its cell (8 here) at one advert per min_advert_gap_s each.
    # (plus one advert per node for the run window being a whole number of intervals).
    assert 0 < r["gossip_advert_bytes_per_node_s"] <= 7 * g.advert_bytes / g.min_advert_gap_s * 1.1
    assert r["flat_advert_bytes_per_node_s"] > r["gossip_advert_bytes_per_node_s"]
    assert r["probes_sent"] > 0


def test_entries_probe_other_cells_only_when_their_own_is_busy() -> None:
    """worth_probing in the simulator: at a trickle every entry's cell has a free member and
    hardly any probe goes out; at a load its cell cannot absorb, probes go out."""
    def run(rate: float) -> dict[str, Any]:
        arrivals = [{**a, "rate_per_s": rate} for a in BASE["arrivals"]]
        return Simulation(scenario(arrivals=arrivals), "meshd").run()

    quiet, busy = run(0.5), run(12.0)
    assert quiet["probes_sent"] == 0 and quiet["probes_skipped"] > 5, quiet
    assert busy["probes_sent"] > 0
    assert busy["probes_sent"] / busy["decisions"] > quiet["probes_sent"] / quiet["decisions"]


def test_cli_json_has_the_promised_keys(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    csv_path = tmp_path / "out.csv"
    rc = main(["sim", str(SCENARIOS / "tiny.toml"), "--duration", "8", "--strategies",
               "meshd,random", "--json", "--no-progress", "--seed", "4", "--csv", str(csv_path)])  # fmt: skip
    assert rc == 0
    data = json.loads(capsys.readouterr().out)
    assert list(data) == ["meshd", "random"]
    for r in data.values():
        for key in ("ttft_p50_ms", "ttft_p95_ms", "ttft_p99_ms", "cost_per_1k_tokens",
                    "utilization_stddev", "completed", "failed"):  # fmt: skip
            assert key in r and not (isinstance(r[key], float) and math.isnan(r[key]))
    assert csv_path.read_text().splitlines()[0].startswith("strategy,ttft_p50_ms")


def test_cli_table_plot_and_errors(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    png = tmp_path / "cmp.png"
    rc = main(["sim", str(SCENARIOS / "tiny.toml"), "--duration", "5", "--strategies", "meshd",
               "--no-progress", "--plot", str(png), "--advert-interval", "0.5",
               "--fail-fraction", "0.1"])  # fmt: skip
    out = capsys.readouterr().out
    assert rc == 0 and "TTFT p50" in out and "meshd" in out
    pytest.importorskip("matplotlib")
    assert png.stat().st_size > 1000
    assert main(["sim", str(SCENARIOS / "tiny.toml"), "--strategies", "fastest"]) == 78
    assert "unknown strategy 'fastest'" in capsys.readouterr().err
    bad = tmp_path / "bad.toml"
    bad.write_text('base = "' + str(SCENARIOS / "tiny.toml") + '"\n[sim]\nspeed = 1\n')
    assert main(["sim", str(bad)]) == 78
    assert "unknown key 'sim.speed'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("cells", "want"),
    [(1, 0), (16, 16), (64, 64), (65, 64 + 2), (4096, 64 + 64), (31250, 64 + 64 + 8)],
)
def test_summary_tree_bounds_what_a_node_hears(cells: int, want: int) -> None:
    from meshd.sim.views import summary_bytes_per_node_s

    assert summary_bytes_per_node_s(cells, 64, 1000, 5.0) == pytest.approx(want * 1000 / 5.0)


def test_same_result_in_another_process_with_another_hash_seed() -> None:
    """Nothing may depend on set or dict order of strings (PYTHONHASHSEED) or object addresses."""
    import os
    import subprocess
    import sys

    def run(hash_seed: str) -> dict:
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        out = subprocess.run(
            [sys.executable, "-m", "meshd", "sim", str(SCENARIOS / "churn-64.toml"), "--duration",
             "20", "--strategies", "meshd,lwsq", "--json", "--no-progress"],
            env=env, capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        data = json.loads(out)
        for r in data.values():
            for k in ("wall_s", "cpu_s", "max_rss_mib"):
                r.pop(k)
        return data

    assert run("1") == run("2")


def test_wait_bounded_admission_refuses_only_for_meshd_and_loses_nothing() -> None:
    on = Simulation(scenario(), "meshd").run()
    assert on["wait_refusals"] > 0  # some first attempts met a full node and moved on
    assert on["completed"] + on["failed"] == on["arrived"]
    assert on["failed"] == 0
    off = Simulation(scenario(policy={"wait_bound_attempts": 0}), "meshd").run()
    assert off["wait_refusals"] == 0
    assert Simulation(scenario(), "lwsq").run()["wait_refusals"] == 0  # the baselines run as published
    # the bound spares requests queueing behind a full node: the TTFT tail is no worse
    assert on["ttft_p95_ms"] <= off["ttft_p95_ms"] * 1.05
