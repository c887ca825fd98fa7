"""The baselines are fair: each node's round-robin starts at its own seeded offset, the herding
lockstep round-robin is only there when named, and load sweeps compare every strategy with the
best other one at each load."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from meshd.cli.main import main
from meshd.sim import sweep
from meshd.sim.capacity import capacity
from meshd.sim.loop import Simulation
from meshd.sim.world import World

from .helpers import LENGTHS, SCENARIOS, scenario

GPU = {"name": "gpu", "prefill_tps": 4000.0, "decode_tps": 40.0, "concurrency": 4,
       "max_queue": 16, "cost_per_hour": 0.5}  # fmt: skip


def homogeneous(**tables: Any) -> Any:
    """16 identical GPU nodes in one cell, Poisson arrivals, adverts every 2 s, no probes."""
    return scenario(
        hardware=[GPU],
        region=[{"name": "a", "nodes": [{"hardware": "gpu", "count": 16, "serve": ["m"]}]}],
        arrivals=[{"region": "a", "model": "m", "process": "poisson", "rate_per_s": 10.0,
                   **LENGTHS}],
        gossip={"advert_interval_s": 2.0, "cell_size": 16, "probes": 0},
        latency={"inter_region_ms": {}},
        **tables,
    )  # fmt: skip


def test_each_node_starts_its_round_robin_at_its_own_seeded_offset() -> None:
    sc = homogeneous()
    first = [n.rr for n in World(sc, 3).nodes]
    assert first == [n.rr for n in World(sc, 3).nodes]  # the seed fixes them
    assert len(set(first)) == len(first)  # and they differ across nodes
    assert len({x % 16 for x in first}) >= 8  # ... also as a start among 16 candidates
    assert [n.rr for n in World(sc, 4).nodes] != first
    # The mesh itself does not depend on the offsets (the same one as before they existed).
    assert [n.coord for n in World(sc, 3).nodes] == [n.coord for n in World(sc, 3).nodes]
    assert all(n.rr == 0 for n in Simulation(sc, "round_robin_lockstep", seed=3).world.nodes)
    assert [n.rr for n in Simulation(sc, "round_robin", seed=3).world.nodes] == first


def test_lockstep_round_robin_herds_and_the_fair_one_does_not() -> None:
    sc = sweep.at_load(homogeneous(), 0.5)
    res = {s: Simulation(sc, s).run() for s in ("round_robin_lockstep", "round_robin", "random")}
    p95 = {s: r["ttft_p95_ms"] for s, r in res.items()}
    assert all(r["failed"] == 0 for r in res.values())
    # In step, every entry node sends to the same server: queues where there need be none.
    assert p95["round_robin_lockstep"] > 2.0 * p95["round_robin"], p95
    assert p95["round_robin_lockstep"] > 2.0 * p95["random"], p95
    # Out of step, round-robin is at least as good as random (it spreads more evenly).
    assert p95["round_robin"] <= 1.25 * p95["random"], p95


def test_at_load_scales_the_arrival_rates_to_the_asked_fraction_of_capacity() -> None:
    sc = homogeneous()
    for load in (0.1, 0.5, 0.95):
        scaled = sweep.at_load(sc, load)
        assert capacity(scaled).load == pytest.approx(load)
        assert capacity(scaled).capacity_rps == pytest.approx(capacity(sc).capacity_rps)
    # Stretched, a load below the scenario's own runs longer: as many requests as at its own.
    own = capacity(sc).load
    light = sweep.at_load(sc, own / 4, stretch=True)
    assert light.run.duration_s == pytest.approx(4 * sc.run.duration_s)
    assert sweep.at_load(sc, own * 1.2, stretch=True).run.duration_s == sc.run.duration_s
    assert sweep.parse_loads("0.9, 0.1,0.5,0.1") == (0.1, 0.5, 0.9)
    for bad in ("", "0", "x", "-0.5", "7"):
        with pytest.raises(Exception, match="--sweep-load"):
            sweep.parse_loads(bad)


def _fake(p95: float, p99: float, cost: float = 1.0) -> dict[str, Any]:
    return {"ttft_p50_ms": p95 / 2, "ttft_p95_ms": p95, "ttft_p99_ms": p99,
            "cost_per_1k_tokens": cost, "completed": 10, "failed": 0}  # fmt: skip


def test_the_yardstick_is_the_best_other_strategy_never_lockstep() -> None:
    fake = {
        0.5: {"meshd": _fake(80, 90, 0.5), "round_robin": _fake(100, 400), "lwsq": _fake(120, 150),
              "round_robin_lockstep": _fake(10, 10)},
        0.9: {"meshd": _fake(300, 500, 1.0), "round_robin": _fake(200, 1000),
              "lwsq": _fake(900, 800), "round_robin_lockstep": _fake(10, 10)},
    }  # fmt: skip
    rows = {(r["load"], r["strategy"]): r for r in sweep.rows(fake)}
    assert len(rows) == 8
    m = rows[(0.5, "meshd")]
    assert m["ttft_p95_ms_best_other"] == "round_robin" and m["ttft_p95_ms_vs_best_other"] == 0.8
    assert m["ttft_p99_ms_best_other"] == "lwsq" and m["ttft_p99_ms_vs_best_other"] == 0.6
    assert m["cost_vs_round_robin"] == 0.5
    assert rows[(0.9, "meshd")]["ttft_p95_ms_vs_best_other"] == 1.5
    assert rows[(0.5, "round_robin")]["ttft_p95_ms_vs_best_other"] == 100 / 80
    lines = sweep.yardstick(fake)
    assert lines[0] == ("load 0.50: meshd vs best other: p95 0.80x round_robin, "
                        "p99 0.60x lwsq, cost 0.50x round_robin")  # fmt: skip
    assert math.isnan(sweep.ratio(1.0, math.nan))


def test_cli_sweep_prints_one_row_per_strategy_and_load_with_the_ratio(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    csv_path = tmp_path / "sweep.csv"
    args = ["sim", str(SCENARIOS / "tiny.toml"), "--duration", "4", "--strategies",
            "meshd,round_robin,random", "--sweep-load", "0.2,0.6", "--no-progress",
            "--csv", str(csv_path)]  # fmt: skip
    assert main(args) == 0
    out = capsys.readouterr().out.splitlines()
    head = next(i for i, line in enumerate(out) if line.startswith("load"))
    assert "p95/best other" in out[head] and "p99/best other" in out[head]
    body = out[head + 2 : head + 8]
    assert [(r.split()[0], r.split()[1]) for r in body] == [
        (x, s) for x in ("0.20", "0.60") for s in ("meshd", "round_robin", "random")
    ]
    assert all(r.split()[7].endswith("x") for r in body)
    assert out[head + 8].startswith("load 0.20: meshd vs best other: p95 ")
    assert len(csv_path.read_text().splitlines()) == 7
    # Deterministic: the same sweep again gives the same figures (JSON rows here).
    assert main([*args, "--json"]) == 0
    a = json.loads(capsys.readouterr().out)
    assert main([*args, "--json"]) == 0
    b = json.loads(capsys.readouterr().out)
    assert a["rows"] == b["rows"] and len(a["rows"]) == 6
    assert a["rows"][0]["ttft_p95_ms_vs_best_other"] > 0


def test_the_floor_is_prefill_on_the_fastest_hardware_and_nobody_beats_it() -> None:
    sc = sweep.at_load(homogeneous(), 0.3)
    floor = sweep.floor_ms(sc)
    # LENGTHS: lognormal prompts of mean 200 (sigma 0.6) at 4000 tokens/s: median ~42 ms.
    assert 38.0 < floor["ttft_p50_ms"] < 46.0
    assert floor["ttft_p50_ms"] < floor["ttft_p95_ms"] < floor["ttft_p99_ms"]
    for s in ("meshd", "latency_only"):
        r = Simulation(sc, s).run()
        assert r["ttft_p95_ms"] >= 0.9 * floor["ttft_p95_ms"], (s, r["ttft_p95_ms"], floor)
