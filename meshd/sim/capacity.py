"""How loaded a scenario is: offered requests per second against what its nodes can serve.

A node's capacity is ``concurrency / E[service time]`` with the service time of the scenario's
mean request (prefill of the mean prompt plus decode of the mean output; both are linear, so the
mean of the service time is the service time of the means). Only nodes serving a model whole
count towards that model's capacity. The figure is printed by ``meshd sim`` and quoted in
docs/sim.md so a reader can judge how hard a scenario pushes the mesh.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshd.core import predict
from meshd.sim.scenario import Scenario
from meshd.sim.workload import mean_length


@dataclass(frozen=True)
class Capacity:
    offered_rps: float
    capacity_rps: float
    by_hardware: dict[str, tuple[int, float]]  # class -> (nodes, capacity rps)

    @property
    def load(self) -> float:
        return self.offered_rps / self.capacity_rps if self.capacity_rps > 0 else float("inf")


def capacity(sc: Scenario) -> Capacity:
    offered = sum(a.rate_per_s for a in sc.arrivals)
    total = offered or 1.0
    prompt = sum(a.rate_per_s * mean_length(a.prompt_tokens) for a in sc.arrivals) / total
    output = sum(a.rate_per_s * mean_length(a.output_tokens) for a in sc.arrivals) / total
    models = {a.model for a in sc.arrivals}
    if "auto" in models:  # model tiers (docs/tiers.md): any tiered model may serve
        models |= {m.name for m in sc.models.values() if m.tier}
    by_hw: dict[str, tuple[int, float]] = {}
    cap = 0.0
    for region in sc.regions:
        for g in region.groups:
            if not any(s.model in models and s.layer_start == 0 and
                       s.layer_end == sc.models[s.model].num_layers for s in g.serve):  # fmt: skip
                continue
            hw = sc.hardware[g.hardware]
            service_s = predict.slot_s(prompt, max(output - 1.0, 0.0), hw.prefill_tps, hw.decode_tps)
            c = g.count * hw.concurrency / service_s
            n, prev = by_hw.get(hw.name, (0, 0.0))
            by_hw[hw.name] = (n + g.count, prev + c)
            cap += c
    return Capacity(offered_rps=offered, capacity_rps=cap, by_hardware=by_hw)
