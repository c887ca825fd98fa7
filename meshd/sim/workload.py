"""Arrival processes and request sizes.

Every arrival stream draws from its own ``random.Random`` seeded from the scenario seed and the
stream's index, so every strategy in one comparison sees the very same requests at the same
instants at the same entry nodes (common random numbers): differences in the results come from
the routing alone.
"""

from __future__ import annotations

import math
import random

from meshd.sim.scenario import ArrivalSpec, LengthDist


def sample_length(d: LengthDist, rng: random.Random) -> int:
    """One prompt or output length in tokens."""
    if d.dist == "fixed":
        v = d.mean
    elif d.dist == "uniform":
        v = d.low + (d.high - d.low) * rng.random()
    else:  # lognormal with the given mean
        mu = math.log(d.mean) - d.sigma * d.sigma / 2.0
        v = rng.lognormvariate(mu, d.sigma)
    return max(d.low, min(d.high, int(round(v))))


def mean_length(d: LengthDist, samples: int = 20000, seed: int = 7) -> float:
    """The mean after clamping (used for capacity figures), estimated by sampling."""
    if d.dist == "fixed":
        return float(max(d.low, min(d.high, int(round(d.mean)))))
    rng = random.Random(seed)
    return sum(sample_length(d, rng) for _ in range(samples)) / samples


class ArrivalStream:
    """Arrival instants of one ``[[arrivals]]`` entry; ``next_time()`` walks forward."""

    def __init__(self, spec: ArrivalSpec, index: int, seed: int) -> None:
        self.spec = spec
        self.index = index
        self.rng = random.Random((seed * 1_000_003) ^ (index * 7919 + 17))
        self.t = 0.0
        s = spec
        if s.process == "bursty":
            # Two-state modulated Poisson: the burst rate is burst_factor times the calm rate,
            # both scaled so the long-run mean is rate_per_s.
            w = s.calm_mean_s + s.burst_factor * s.burst_mean_s
            self.calm_rate = s.rate_per_s * (s.calm_mean_s + s.burst_mean_s) / w
            self.burst_rate = self.calm_rate * s.burst_factor
            self.in_burst = False
            self.state_end = self.rng.expovariate(1.0 / s.calm_mean_s)
        self.peak = s.rate_per_s * (1.0 + s.amplitude)

    def rate_at(self, t: float) -> float:
        s = self.spec
        if s.process == "diurnal":
            return s.rate_per_s * (
                1.0 + s.amplitude * math.sin(2 * math.pi * (t + s.phase_s) / s.period_s)
            )
        if s.process == "bursty":
            return self.burst_rate if self.in_burst else self.calm_rate
        return s.rate_per_s

    def next_time(self) -> float:
        """The next arrival instant (``inf`` when the rate is 0)."""
        s = self.spec
        rng = self.rng
        if s.rate_per_s <= 0.0:
            return math.inf
        if s.process == "poisson":
            self.t += rng.expovariate(s.rate_per_s)
        elif s.process == "diurnal":
            while True:  # thinning against the peak rate
                self.t += rng.expovariate(self.peak)
                if rng.random() * self.peak <= self.rate_at(self.t):
                    break
        else:
            while True:
                rate = self.burst_rate if self.in_burst else self.calm_rate
                step = rng.expovariate(rate)
                if self.t + step <= self.state_end:
                    self.t += step
                    break
                # No arrival before the state flips; memorylessness lets us restart from there.
                self.t = self.state_end
                self.in_burst = not self.in_burst
                mean = s.burst_mean_s if self.in_burst else s.calm_mean_s
                self.state_end = self.t + rng.expovariate(1.0 / mean)
        return self.t

    def sizes(self) -> tuple[int, int]:
        """Prompt and output tokens of the next request."""
        return (
            sample_length(self.spec.prompt_tokens, self.rng),
            sample_length(self.spec.output_tokens, self.rng),
        )
