"""Simulation scenarios: what ``testnet/scenarios/*.toml`` may say, as frozen dataclasses.

A scenario names hardware classes, models, regions with groups of nodes, a latency model,
arrival streams, failures and joins, and the gossip and routing settings. ``docs/sim.md``
documents every key; the defaults below are the documented ones. Files are read strictly by
``meshd.sim.scenario_parse`` (``load_scenario``, ``scenario_from_dict``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from meshd.core.request_life import MAX_ATTEMPTS
from meshd.core.snapshot import Policy


@dataclass(frozen=True)
class RunSettings:
    duration_s: float = 60.0
    drain_s: float = 60.0  # after the last arrival, how long in-flight work may finish
    seed: int = 1
    timeout_s: float = 30.0  # a request not started this long after arrival is dropped
    max_attempts: int = MAX_ATTEMPTS  # counted failures before a request fails (the daemon's 3)
    failure_detect_s: float = 1.0  # how long an entry node takes to notice a dead peer
    warmup_s: float = 0.0  # requests arriving before this are served but not measured


@dataclass(frozen=True)
class GossipSettings:
    advert_interval_s: float = 2.0  # periodic advert
    early_adverts: bool = True  # also advertise early on a significant load change (as the daemon)
    min_advert_gap_s: float = 1.0  # never two adverts of a node closer than this
    advert_settle_s: float = 0.25  # the daemon lets a burst of changes settle this long
    advert_delay_ms: tuple[float, float] = (20.0, 80.0)  # propagation through the cell
    advert_loss: float = 0.0  # chance that one receiver misses one advert
    advert_ttl_s: float = 0.0  # 0: three advert intervals
    cell_size: int = 64  # nodes sharing full adverts; a region splits into equal cells
    summary_interval_s: float = 5.0
    summary_delay_ms: float = 200.0
    summary_top_k: int = 4  # least-loaded nodes each cell summary names
    summary_fanout: int = 64  # summaries form a tree: at most this many per topic
    probes: int = 4  # remote candidates an entry node keeps probed
    probe_interval_s: float = 1.0
    # Sizes on the wire. An advert as meshd.core.advert encodes it (591 bytes with one model and
    # an 8-d coordinate) plus its signature, its author's certificate and framing: 930 bytes.
    advert_bytes: int = 930
    summary_bytes: int = 1000  # a signed cell summary (or region digest) naming 4 nodes
    probe_bytes: int = 160  # one probe and its answer
    gossip_degree: int = 4  # gossipsub mesh degree D (the daemon's default): copies relayed


@dataclass(frozen=True)
class VivaldiSettings:
    mode: str = "vivaldi"  # or "oracle": every node knows every true RTT
    warmup_rounds: int = 200  # RTT samples per node before the run (a mesh already running)
    measured_ttl_s: float = 30.0  # a measured RTT overrides the estimate this long


@dataclass(frozen=True)
class LatencySettings:
    intra_region_ms: tuple[float, float] = (5.0, 20.0)
    access_ms: tuple[float, float] = (0.2, 2.0)  # per node, added to each RTT it is in
    jitter_ms: float = 1.0  # mean of exponential jitter on each RTT sample
    default_inter_region_ms: float = 100.0
    inter_region_ms: dict[tuple[str, str], float] = field(default_factory=dict)


@dataclass(frozen=True)
class Hardware:
    name: str
    prefill_tps: float
    decode_tps: float  # per stream
    concurrency: int
    max_queue: int
    cost_per_hour: float
    power_w: float = 0.0  # measured power draw it advertises (0: not measured)
    # continuous batching: aggregate decode tokens/s at batch 1, 2, 4, ... (a node's advert
    # `batch_tps`); empty: every stream decodes at decode_tps whatever the concurrency
    batch_tps: tuple[float, ...] = ()
    # tokens of KV its prefix cache keeps (the daemon's [engine] prefix_cache_mb over the
    # model's KV bytes per token; meshd.sim.prefixes); 0: none
    prefix_cache_tokens: int = 0
    # with a prefix cache, finished answers' KV is kept too (the daemon's [engine] keep_answers)
    keep_answers: bool = True


@dataclass(frozen=True)
class ModelSpec:
    name: str
    num_layers: int
    tier: str = ""  # meshd.core.tiers: "micro", "small", "large" ("": none; docs/tiers.md)
    quality: float = 0.0
    context_length: int = 0


@dataclass(frozen=True)
class TierSettings:
    """``[tiers]``: how ``model = "auto"`` arrivals are classified and routed (docs/tiers.md)."""

    threshold: float = 0.0  # 0: the shipped classifier's own threshold
    small_below: float = 0.0
    max_ttft_ms: float = 5000.0
    # "shipped": each request's score is drawn from the shipped classifier's held-out scores
    # of its true class (so the measured error rate); "perfect": 0 for simple, 1 for complex
    scores: str = "shipped"


@dataclass(frozen=True)
class ServeSpec:
    model: str
    layer_start: int
    layer_end: int


@dataclass(frozen=True)
class NodeGroup:
    hardware: str
    count: int
    serve: tuple[ServeSpec, ...]
    labels: frozenset[str] = frozenset()


@dataclass(frozen=True)
class RegionSpec:
    name: str
    groups: tuple[NodeGroup, ...]


@dataclass(frozen=True)
class LengthDist:
    dist: str  # "fixed", "uniform" or "lognormal"
    mean: float = 0.0
    sigma: float = 0.0
    low: int = 1
    high: int = 1 << 20


@dataclass(frozen=True)
class ChatSpec:
    """The multi-turn chat workload (``[chat]``; ``meshd.sim.chat`` states where each default
    comes from)."""

    rate_per_s: float = 10.0  # requests per second, every turn counted
    mean_turns: float = 2.0
    user_tokens: LengthDist = field(default_factory=lambda: LengthDist(
        "lognormal", mean=69.5, sigma=1.0, low=1, high=4096))
    answer_tokens: LengthDist = field(default_factory=lambda: LengthDist(
        "lognormal", mean=214.5, sigma=0.8, low=1, high=2048))
    system_tokens: LengthDist = field(default_factory=lambda: LengthDist(
        "lognormal", mean=400.0, sigma=0.5, low=16, high=4096))
    shared_prompts: int = 4
    shared_share: float = 0.5  # conversations that start with a shared system prompt
    think_s: float = 20.0
    answer_tps: float = 30.0
    context_tokens: int = 8192


@dataclass(frozen=True)
class ArrivalSpec:
    region: str
    model: str
    process: str  # "poisson", "bursty" or "diurnal"
    rate_per_s: float  # long-run mean
    prompt_tokens: LengthDist
    output_tokens: LengthDist
    residency: str | None = None
    complex_share: float = 0.0  # model "auto": the share of these requests that are complex
    burst_factor: float = 4.0
    burst_mean_s: float = 5.0
    calm_mean_s: float = 30.0
    period_s: float = 120.0
    amplitude: float = 0.5
    phase_s: float = 0.0
    # process "chat": the conversations' distributions ([chat]; rate_per_s is this stream's)
    chat: ChatSpec | None = None


@dataclass(frozen=True)
class EventSpec:
    at_s: float
    action: str  # "fail" or "join"
    fraction: float = 0.0
    count: int = 0
    region: str | None = None
    hardware: str | None = None
    serve: tuple[ServeSpec, ...] = ()


@dataclass(frozen=True)
class Scenario:
    name: str
    file: str
    run: RunSettings
    gossip: GossipSettings
    vivaldi: VivaldiSettings
    latency: LatencySettings
    policy: Policy
    hardware: dict[str, Hardware]
    models: dict[str, ModelSpec]
    regions: tuple[RegionSpec, ...]
    arrivals: tuple[ArrivalSpec, ...]
    events: tuple[EventSpec, ...] = ()
    tiers: TierSettings = field(default_factory=TierSettings)

    @property
    def node_count(self) -> int:
        return sum(g.count for r in self.regions for g in r.groups)

    def with_overrides(
        self,
        *,
        duration_s: float | None = None,
        seed: int | None = None,
        advert_interval_s: float | None = None,
        fail_fraction: float | None = None,
    ) -> Scenario:
        """A copy with the command line's overrides applied."""
        s = self
        if duration_s is not None:
            s = dataclasses.replace(s, run=dataclasses.replace(s.run, duration_s=duration_s))
        if seed is not None:
            s = dataclasses.replace(s, run=dataclasses.replace(s.run, seed=seed))
        if advert_interval_s is not None:
            gap = min(s.gossip.min_advert_gap_s, advert_interval_s)
            g = dataclasses.replace(
                s.gossip, advert_interval_s=advert_interval_s, min_advert_gap_s=gap,
                advert_settle_s=min(s.gossip.advert_settle_s, gap / 4.0),
            )  # fmt: skip
            s = dataclasses.replace(s, gossip=g)
        if fail_fraction:
            ev = EventSpec(at_s=s.run.duration_s / 2, action="fail", fraction=fail_fraction)
            s = dataclasses.replace(s, events=(*s.events, ev))
        return s


_STRATEGY_FIELDS = frozenset({"strategy"})


def policy_fields() -> dict[str, Any]:
    """The ``[policy]`` keys a scenario may set: every ``Policy`` field but the strategy."""
    return {f.name: f for f in dataclasses.fields(Policy) if f.name not in _STRATEGY_FIELDS}
