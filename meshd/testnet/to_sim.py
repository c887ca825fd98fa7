"""A simulator scenario for one fixed route of an emulated testnet (docs/sim.md, "Validation
against the emulated testnet").

``route_scenario`` turns a testnet scenario (``meshd.testnet.scenario``: regions, an RTT matrix,
daemons) plus what the running daemons report (the serving node's advertised speeds, its slots
and queue, the prompt length its entry node counted) into the document of a ``meshd sim``
scenario, so that the testnet file stays the one source of truth for the network and the nodes.
Pure: no I/O, no clock.

Every term, and why it is what it is:

* **Nodes**: the entry node and the serving node, each in its testnet region with its
  certificate labels as the daemon turns them into routing labels (``meshd.node.view``: every
  ``key=value``, the region and residency values, and each residency tag). The route must be
  fixed: the requests' residency tag allows the server and nothing else, the entry node
  included (checked, else ``ConfigError``). The server's speeds are the ones it advertises
  (``prefill_tps``, ``decode_tps``: what the daemon's runner measured, and what a real entry
  node's router reads); its slots and queue are its ``max_concurrency`` and ``max_queue``. The
  entry node never serves, so its own speeds do not enter; it gets the server's.
* **Network**: the RTT between the two regions is the RTT the entry daemon measures to the
  server (``rtt_ms``: ``rtt_measured_ms`` of ``meshd peers``, pings on the very stream requests
  travel on), or, if none is given, the testnet link's configured ``rtt_ms``. The simulator
  sends the request out and the first token back after half a sampled RTT each, and uses the
  same figure as the entry node's measured RTT; in the daemon that figure is the ping round
  trip, which holds the configured RTT plus what the emulator and the two daemons add to any
  frame (reading, decrypting, framing: about 1-3 ms on this testnet), so that is the figure
  that means what the simulator's RTT means. The emulator's jitter is uniform and symmetric
  about the configured RTT (mean zero); the simulator's jitter is one-sided (exponential, mean
  ``jitter_ms``), so it is set to 0, which keeps the median RTT. No access term: the emulator
  adds nothing per node.
* **Gossip**: the testnet's advert interval; the daemons' early adverts and minimum gap
  (``GossipConfig`` defaults); the propagation delay measured by the daemons
  (``advert_delay_ms``); no loss (adverts ride TCP). The simulator forms its cells inside a
  region, so the entry node learns of the server in the other region through cell summaries
  and one probe (docs/gossip-at-scale.md), where the two daemons, gossiping flat, hear each
  other's adverts. With one eligible node this changes what the router knows of the server's
  load, never where the request goes. The first probe's answer comes an RTT after the first
  request, which finds no route: ``warmup_s`` leaves the first seconds out of the figures (the
  test warms the testnet up too).
* **Routing**: the entry node's own policy (strategy, LWSQ and sampling knobs, hop limit) and
  hedging off where its config turns it off. Vivaldi is "oracle": with one eligible node the
  estimate cannot change the route.
* **Workload**: Poisson arrivals at the entry node at the test's rate, with the prompt length
  the entry node counted and ``max_tokens`` generated tokens; ``timeout_s`` is the entry node's
  first-token timeout.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from meshd.config import Config, GossipConfig, parse_config
from meshd.core.routing import residency_allows
from meshd.errors import ConfigError
from meshd.testnet.scenario import NodeDef
from meshd.testnet.scenario import Scenario as TestnetScenario


@dataclass(frozen=True)
class ServerFigures:
    """What the serving daemon reports: advertised speeds (tokens/s per stream), slots, queue."""

    prefill_tps: float
    decode_tps: float
    max_concurrency: int
    max_queue: int


@dataclass(frozen=True)
class RouteLoad:
    """The requests of the comparison: all enter at one node, all tagged with one residency."""

    rate_per_s: float
    prompt_tokens: int
    output_tokens: int
    residency: str


def routing_labels(node: NodeDef) -> list[str]:
    """A node's labels as the daemon's router sees them (``meshd.node.view``)."""
    labels = {"region": node.region, **dict(node.labels)}
    out = {f"{k}={v}" for k, v in labels.items()}
    out |= {v for k, v in labels.items() if k in ("region", "residency")}
    out |= {t for k, v in labels.items() if k == "residency" for t in v.split(",")}
    return sorted(out)


def _entry_config(tn: TestnetScenario, entry: str) -> Config:
    e = tn.node(entry)
    return parse_config({**e.daemon_config(), "models": e.daemon_models()}, f"{tn.source} {entry}")


def entry_strategy(tn: TestnetScenario, entry: str) -> str:
    """The routing strategy the entry node's daemon runs (the simulation runs the same)."""
    return _entry_config(tn, entry).routing.strategy


def route_scenario(
    tn: TestnetScenario,
    *,
    entry: str,
    server: str,
    model: str,
    num_layers: int,
    figures: ServerFigures,
    load: RouteLoad,
    duration_s: float,
    seed: int = 1,
    advert_delay_ms: float = 40.0,
    warmup_s: float = 10.0,
    rtt_ms: float | None = None,
) -> dict[str, Any]:
    """The sim scenario document (what ``scenario_from_dict`` reads) for ``entry -> server``."""
    try:
        e, s = tn.node(entry), tn.node(server)
    except KeyError as k:
        raise ConfigError(f"{tn.source}: no node named {k.args[0]!r}") from None
    if e.region == s.region:
        raise ConfigError(f"{tn.source}: {entry} and {server} are in the same region; the route "
                          "under test crosses a link between regions")
    allowed = [n.name for n in tn.nodes
               if residency_allows(frozenset(routing_labels(n)), load.residency)]
    if allowed != [server]:
        raise ConfigError(f"{tn.source}: residency {load.residency!r} must allow {server} alone, "
                          f"not {allowed or 'no node'}: the route would not be fixed")
    for f, v in (("prefill_tps", figures.prefill_tps), ("decode_tps", figures.decode_tps)):
        if not v > 0:
            raise ConfigError(f"{server} has not measured its {f} yet ({v!r}): serve a few "
                              "requests first")
    cfg = _entry_config(tn, entry)
    link = tn.region_link(e.region, s.region)
    inside = [tn.region(r).inside.rtt_ms for r in (e.region, s.region)]
    gossip = GossipConfig()
    policy: dict[str, Any] = {
        "lwsq_alpha": cfg.routing.lwsq_alpha,
        "lwsq_beta": cfg.routing.lwsq_beta,
        "sample_d": cfg.routing.sample_d,
        "max_hops": cfg.routing.max_hops,
    }
    if not cfg.routing.hedge:
        policy["hedge_factor"] = 0.0
    hw = {
        "prefill_tps": figures.prefill_tps,
        "decode_tps": figures.decode_tps,
        "concurrency": figures.max_concurrency,
        "max_queue": figures.max_queue,
        "cost_per_hour": 0.0,
    }
    return {
        "name": f"{tn.name}-{entry}-{server}",
        "sim": {
            "duration_s": duration_s,
            "drain_s": 60.0,
            "seed": seed,
            "timeout_s": cfg.routing.first_token_timeout_s,
            "warmup_s": warmup_s,
        },
        "gossip": {
            "advert_interval_s": tn.advert_interval_s,
            "early_adverts": True,
            "min_advert_gap_s": min(gossip.min_advert_gap_s, tn.advert_interval_s),
            "advert_delay_ms": [advert_delay_ms, advert_delay_ms],
            "advert_loss": 0.0,
            "probes": 1,
        },
        "vivaldi": {"mode": "oracle"},
        "latency": {
            "intra_region_ms": [min(inside), max(inside)],
            "access_ms": [0.0, 0.0],
            "jitter_ms": 0.0,
            "inter_region_ms": {f"{e.region}/{s.region}": link.rtt_ms if rtt_ms is None else rtt_ms},
        },
        "policy": policy,
        "hardware": [{"name": "entry", **hw}, {"name": "server", **hw}],
        "model": [{"name": model, "num_layers": num_layers}],
        "region": [
            {"name": e.region, "nodes": [{"hardware": "entry", "count": 1, "serve": [model],
                                          "labels": routing_labels(e)}]},
            {"name": s.region, "nodes": [{"hardware": "server", "count": 1, "serve": [model],
                                          "labels": routing_labels(s)}]},
        ],
        "arrivals": [{
            "region": e.region,
            "model": model,
            "process": "poisson",
            "rate_per_s": load.rate_per_s,
            "residency": load.residency,
            "prompt_tokens": {"dist": "fixed", "mean": load.prompt_tokens},
            "output_tokens": {"dist": "fixed", "mean": load.output_tokens},
        }],
    }  # fmt: skip
