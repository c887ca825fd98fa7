"""The simulated network's true round-trip times, and noisy samples of them.

Each node gets a place in its region (a point in a unit disk) and an access latency (its last
mile). Inside a region the RTT grows with distance from ``intra_region_ms[0]`` to
``intra_region_ms[1]``; across regions it is the scenario's matrix entry; both add the two
nodes' access latencies. Nothing is stored per pair, so 100,000 nodes cost O(N) memory. Samples
add exponential jitter, the way queueing in routers skews real RTTs upward.
"""

from __future__ import annotations

import math
import random

from meshd.sim.scenario import LatencySettings


class LatencyModel:
    def __init__(self, cfg: LatencySettings, regions: list[str]) -> None:
        self.cfg = cfg
        self.regions = regions
        n = len(regions)
        self._inter = [[0.0] * n for _ in range(n)]
        for i, a in enumerate(regions):
            for j, b in enumerate(regions):
                if i != j:
                    self._inter[i][j] = cfg.inter_region_ms.get((a, b), cfg.default_inter_region_ms)
        self._lo, hi = cfg.intra_region_ms
        self._half_span = (hi - self._lo) / 2.0  # the unit disk's diameter is 2
        self._jitter = cfg.jitter_ms
        # Per node: region index, x, y, access ms (parallel lists, grown by place()).
        self.region: list[int] = []
        self.x: list[float] = []
        self.y: list[float] = []
        self.access: list[float] = []

    def place(self, region_index: int, rng: random.Random) -> int:
        """Give a new node its place; returns its index."""
        r = math.sqrt(rng.random())
        a = rng.random() * 2.0 * math.pi
        lo, hi = self.cfg.access_ms
        self.region.append(region_index)
        self.x.append(r * math.cos(a))
        self.y.append(r * math.sin(a))
        self.access.append(lo + (hi - lo) * rng.random())
        return len(self.region) - 1

    def rtt_ms(self, a: int, b: int) -> float:
        """The true RTT between nodes ``a`` and ``b`` (0 for a node and itself)."""
        if a == b:
            return 0.0
        ra = self.region[a]
        rb = self.region[b]
        if ra == rb:
            d = math.hypot(self.x[a] - self.x[b], self.y[a] - self.y[b])
            base = self._lo + self._half_span * d
        else:
            base = self._inter[ra][rb]
        return base + self.access[a] + self.access[b]

    def sample_ms(self, a: int, b: int, rng: random.Random) -> float:
        """One measured RTT: the true one plus jitter."""
        rtt = self.rtt_ms(a, b)
        if self._jitter > 0.0 and a != b:
            rtt += rng.expovariate(1.0 / self._jitter)
        return rtt

    def region_rtt_ms(self, ra: int, rb: int) -> float:
        """A typical RTT between two regions (the middle of the intra range inside one)."""
        if ra == rb:
            return self._lo + self._half_span
        return self._inter[ra][rb]
