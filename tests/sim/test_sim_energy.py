"""The simulator's energy: accounted like cost from each hardware class's power_w, reported per
1K tokens next to cost, and weighed by meshd's routing when [policy] energy_weight is set."""

from __future__ import annotations

import copy

import pytest

from meshd.sim.loop import Simulation
from meshd.sim.report import table

from .helpers import BASE, scenario


def with_power(gpu_w: float, cpu_w: float, **policy: float):
    hw = copy.deepcopy(BASE["hardware"])
    hw[0]["power_w"], hw[1]["power_w"] = gpu_w, cpu_w
    return scenario(hardware=hw, sim={"duration_s": 6.0}, policy=policy)


def test_energy_is_accounted_like_cost():
    # a slot-second costs price / 3600 dollars and power joules: with power = price / 3600
    # joules and dollars are the same numbers
    r = Simulation(with_power(0.5 / 3600, 0.05 / 3600), "round_robin").run()
    assert r["energy_per_1k_tokens_j"] == pytest.approx(r["cost_per_1k_tokens"], rel=1e-9)
    assert "J/1K tok" in table({"round_robin": r})
    none = Simulation(scenario(sim={"duration_s": 6.0}), "round_robin").run()
    assert none["energy_per_1k_tokens_j"] is None  # no class measures its power


def test_energy_weight_moves_work_to_the_efficient_nodes():
    # the GPUs are fast but hungry (1,500 W over 4 slots of 40 tok/s: ~9 J/token), the CPUs
    # slow but frugal (20 W, 8 tok/s: 2.5 J/token)
    off = Simulation(with_power(1500.0, 20.0), "meshd").run()
    on = Simulation(with_power(1500.0, 20.0, energy_weight=200.0), "meshd").run()
    # the CPUs are few and slow (5 of 16 nodes, one slot each), so only part of the work can move
    assert on["energy_per_1k_tokens_j"] < 0.95 * off["energy_per_1k_tokens_j"], (on, off)
    assert on["ttft_p95_ms"] > off["ttft_p95_ms"]  # paid for in time to first token
    assert on["served_by_hardware"].get("cpu", 0) > off["served_by_hardware"].get("cpu", 0)
