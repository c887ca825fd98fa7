"""What a node knows about the mesh at one instant: the input of every routing decision.

The daemon builds a ``MeshSnapshot`` from its peer table, its own load and its RTT estimates;
the simulator builds one from its simulated world. The router (``meshd.core.routing``) and the
pipeline planner (``meshd.core.planner``) read only this, so both callers get the very same
decisions. Everything here is immutable and carries no clock: ages are given in seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from meshd.core.request import DEFAULT_MAX_TOKENS
from meshd.core.vivaldi import Coord


@dataclass(frozen=True, slots=True)
class Serving:
    """One model (or a contiguous layer range of it) that a node serves.

    ``layer_start``/``layer_end`` are half open: ``[layer_start, layer_end)``. A node that serves
    the whole model has ``layer_start == 0`` and ``layer_end == num_layers``.
    """

    model: str
    num_layers: int
    layer_start: int
    layer_end: int
    # Per-layer compute speed of this range on this node, measured and gossiped (0: unknown, then
    # derived from the node's whole-model speeds as 1000 / (tps * num_layers)).
    prefill_ms_per_layer_token: float = 0.0  # ms to run one prompt token through one layer
    decode_ms_per_layer: float = 0.0  # ms to run one generated token through one layer
    kv_bytes_per_token: int = 0  # KV cache bytes per token of context in this range (0: unknown)
    model_id: str = ""  # what the model is (meshd.core.modelid; "": not advertised)
    # the advertised sketch of the prompt prefixes its KV prefix cache holds for this range
    # (meshd.core.prefix_names.sketch; empty: none)
    prefix_sketch: bytes = b""

    @property
    def whole(self) -> bool:
        return self.layer_start == 0 and self.layer_end == self.num_layers


@dataclass(frozen=True, slots=True)
class NodeView:
    """One candidate node as seen from the deciding node (which may be the node itself).

    Speeds are measured by the node and gossiped in its advert; ``rtt_ms`` is this node's best
    estimate of the round trip to it (0 for itself). ``sent_since_advert`` counts requests the
    deciding node sent there after that node's last advert, so stale queue figures are corrected
    by what we know we added.
    """

    peer_id: str
    name: str
    region: str = ""
    labels: frozenset[str] = frozenset()
    serving: tuple[Serving, ...] = ()
    queue_depth: int = 0
    in_flight: int = 0
    max_concurrency: int = 1
    max_queue: int = 64
    prefill_tps: float = 1000.0
    decode_tps: float = 50.0
    rtt_ms: float = 0.0
    rtt_source: str = "unknown"  # "local", "measured", "vivaldi" or "unknown"
    advert_age_s: float = 0.0
    sent_since_advert: int = 0
    cost_per_hour: float = 0.0
    free_kv_tokens: int = 1 << 30
    is_local: bool = False
    # Requests per second the node completes when saturated, measured (0: unknown, then derived
    # from prefill_tps/decode_tps and the request's own sizes).
    service_rate_rps: float = 0.0
    # The node's gossiped Vivaldi coordinate; the planner estimates hop-to-hop RTTs from these.
    coord: Coord | None = None
    # Live hardware signals (meshd.core.hwsignals, docs/telemetry.md); None: unknown. The
    # speeds above are already multiplied by speed_factor (kept here to explain decisions).
    free_memory_bytes: int | None = None  # free memory where the node keeps its KV cache
    power_w: float | None = None  # measured power draw
    speed_factor: float = 1.0  # < 1 while throttled
    throttle: tuple[str, ...] = ()  # why (NVML reasons, "thermal:<zone>")

    def serves(self, model: str) -> Serving | None:
        """The whole-model serving entry for ``model``, if this node has one."""
        for s in self.serving:
            if s.model == model and s.whole:
                return s
        return None

    def ranges(self, model: str) -> tuple[Serving, ...]:
        """Every serving entry of ``model`` (whole or partial)."""
        return tuple(s for s in self.serving if s.model == model)


@dataclass(frozen=True, slots=True)
class RouteRequest:
    """What the router needs to know about one request."""

    request_id: str
    model: str
    prompt_tokens: int
    max_tokens: int = DEFAULT_MAX_TOKENS
    residency: str | None = None  # a region/residency tag the serving node's labels must allow
    client: str = "local"
    exclude: frozenset[str] = frozenset()  # peer ids already tried (failover, hedging)
    hops: int = 0
    # the prompt's token ids when the entry node tokenized it (empty: unknown): a node whose
    # advert lists a prefix of them is credited with the prefill it skips (prefix_names)
    prompt_ids: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Policy:
    """Declarative routing policy from config: the hard constraints and strategy knobs."""

    strategy: str = "meshd"
    lwsq_alpha: float = 1.0  # per ms of RTT
    lwsq_beta: float = 50.0  # per queued request
    sample_d: int = 2  # power-of-d choices among the best
    softmax_temperature_ms: float = 0.0  # > 0 switches to a softmax over predicted TTFT
    model_allow: frozenset[str] = frozenset()  # empty: any model
    client_quota: dict[str, int] = field(default_factory=dict)  # client -> max in flight
    max_hops: int = 4
    # meshd strategy knobs (docs/routing.md explains each).
    sample_temperature_ms: float = 100.0  # how sharply sampling favours low predicted TTFT
    staleness_temperature: float = 2.0  # ... less so for a node whose load figures are old
    sample_local: bool = True  # the local node (fresh figures) is one of the sample_d compared
    cost_weight_ms: float = 20.0  # ms of predicted TTFT worth a request price twice the cheapest
    stale_relax_factor: float = 1.0  # advert staleness correction time scale (0: no correction)
    # Decision size and hedging.
    max_fallbacks: int = 8  # peers after the chosen one in RouteDecision.order
    explain_limit: int = 16  # candidates listed in a decision (the rest are counted)
    hedge_factor: float = 2.0  # hedge when no first token by factor * predicted TTFT (0: never)
    hedge_min_ms: float = 25.0  # ... but never sooner than this after sending
    # Wait-bounded admission (meshd strategy; meshd.core.admission): the first attempts may queue
    # at most about the next candidate's predicted TTFT, else the server answers busy at once.
    wait_bound_attempts: int = 2  # attempts that carry a bound (0: never bound)
    wait_bound_min_ms: float = 50.0  # never bound a wait tighter than this
    # meshd: the known part (RTT, prefill, price) of the sampling weights has the temperature
    # sample_temperature_ms times occupancy / known_temperature_full_at (occupancy: requests per
    # slot over the eligible nodes), at least known_temperature_floor of it and at most all of
    # it: sharper while the mesh is less than half busy (floor 1: as before issue 18).
    known_temperature_floor: float = 0.1
    known_temperature_full_at: float = 0.5
    # meshd: while occupancy is below this, choose the global minimum of the score (every
    # candidate compared, not sample_d): with free slots nearly everywhere herding costs little
    # and two candidates can miss the free node next door (0: always sample)
    argmin_below_occupancy: float = 0.5
    # meshd: when some candidate's advert lists a prefix of the prompt, one of the sample_d
    # compared is drawn among those listing the deepest (docs/routing.md, "Prefix credit")
    sample_prefix: bool = True
    # meshd: ms of predicted TTFT worth one joule per generated token, from nodes' measured
    # power (meshd.core.energy, docs/telemetry.md); 0 = energy is not weighed
    energy_weight: float = 0.0


@dataclass(frozen=True, slots=True)
class MeshSnapshot:
    """All candidate nodes (peers and the local node) at one instant, sorted by peer id."""

    local_peer_id: str
    nodes: tuple[NodeView, ...]
    client_in_flight: dict[str, int] = field(default_factory=dict)
    # Memo of per-model indexes built by the router (meshd.core.routing): never compared, and
    # not an __init__ argument, so dataclasses.replace() gives the new snapshot an empty one.
    cache: dict[Any, Any] = field(default_factory=dict, init=False, compare=False, repr=False)

    def by_id(self, peer_id: str) -> NodeView | None:
        for n in self.nodes:
            if n.peer_id == peer_id:
                return n
        return None
