"""What ``meshd status`` and ``meshd peers`` show: the node and its peer table, as plain data."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, Protocol

from meshd.core.advert import Advert
from meshd.core.hwsignals import HwSignals, read_signals
from meshd.core.peertable import PeerTable
from meshd.core.snapshot import Policy
from meshd.core.vivaldi import Coord, estimate_rtt_ms
from meshd.net.attest import Attestor
from meshd.net.gossip import Gossip
from meshd.node.autoplace import AutoPlacer
from meshd.node.cells import Cells
from meshd.node.edge_cache import EdgeCache
from meshd.node.entry import EntryChain
from meshd.node.links import Links
from meshd.node.membership import Membership
from meshd.node.runner import Runner
from meshd.node.serve import RequestServer
from meshd.node.stages import StageServer
from meshd.node.tiering import Tiering
from meshd.node.tokenizers import TokenizerService
from meshd.node.view import coord_of, peer_rtt


class StatusSource(Protocol):
    """What ``meshd status`` reads of the node (``meshd.node.node.Node``): who it is, and the
    statistics of each of its services."""

    node_name: str
    peer_id: str
    addrs: list[str]
    api_url: str | None  # None: the HTTP API is off (or not listening yet)
    started_at: float
    policy: Policy
    stats: dict[str, int]  # the entry path's counters

    @property
    def hardware(self) -> Any: ...

    @property
    def monitor(self) -> Any: ...

    @property
    def runner(self) -> Runner: ...

    @property
    def membership(self) -> Membership: ...

    @property
    def attestor(self) -> Attestor: ...

    @property
    def gossip(self) -> Gossip | None: ...

    @property
    def links(self) -> Links | None: ...

    @property
    def server(self) -> RequestServer: ...

    @property
    def stage_server(self) -> StageServer: ...

    @property
    def placer(self) -> AutoPlacer: ...

    @property
    def entry(self) -> EntryChain: ...

    @property
    def edge_cache(self) -> EdgeCache: ...

    @property
    def tiering(self) -> Tiering: ...

    @property
    def tokenizers(self) -> TokenizerService: ...

    @property
    def cells(self) -> Cells | None: ...


def node_status(node: StatusSource) -> dict[str, Any]:
    m = node.membership
    ms = m.statistics()
    rejections = ms.pop("rejections")
    delays = ms.pop("advert_delay_ms")
    return {
        "name": node.node_name,
        "peer_id": node.peer_id,
        "region": m.region,
        "cell": m.cell,
        "labels": m.labels,
        "addrs": node.addrs,
        "uptime_s": round(time.time() - node.started_at, 1),
        "peers": len(m.table),
        "queue_depth": node.runner.queue_depth(),
        "in_flight": node.runner.in_flight(),
        "models": [s.statistics() for s in node.runner.models.values()],
        "hardware": node.hardware.to_dict() if node.hardware is not None else {},
        "strategy": node.policy.strategy,
        "api_url": node.api_url,
        "coord": {"vec": list(m.coord.vec), "height": m.coord.height, "error": m.coord.error},
        "services": {
            "node": {**ms, **node.stats},
            "advert_rejections": rejections,
            "gossip": {**node.gossip.stats, "sent": dict(node.gossip.sent)} if node.gossip else {},
            "advert_delay_ms": delays,
            "attestation": node.attestor.statistics(),
            "links": node.links.statistics() if node.links else {},
            "request_server": dict(node.server.stats),
            "stage_server": node.stage_server.statistics(),
            "placement": node.placer.statistics(),
            "entry": node.entry.statistics(),
            "cache": node.edge_cache.statistics(),
            "tiers": node.tiering.statistics(),  # model = "auto" (docs/tiers.md)
            "upstreams": {s.name: s.model.statistics() for s in node.runner.models.values()
                          if hasattr(s.model, "base_url")},  # [[models]] upstream
            "tokenizers": node.tokenizers.statistics(),
            "rag": rag.statistics() if (rag := getattr(node, "rag", None)) is not None else {},
            "telemetry": node.monitor.statistics() if node.monitor is not None else {},
            "cells": node.cells.statistics() if node.cells is not None else {},
        },
    }


def signals_dict(sig: HwSignals) -> dict[str, Any]:
    """What routing reads of a node's live hardware (meshd.core.hwsignals), for ``meshd peers``."""
    return {"free_memory_bytes": sig.free_memory_bytes, "power_w": sig.power_w,
            "throttle": list(sig.throttle), "speed_factor": round(sig.speed_factor, 3)}


class PeerSource(Protocol):
    """What ``meshd peers`` reads of membership (``meshd.node.membership.Membership``)."""

    table: PeerTable
    coord: Coord
    via: dict[str, str]

    def cell_of(self, peer_id: str, labels: Mapping[str, str]) -> str | None: ...


def advert_fields(a: Advert) -> dict[str, Any]:
    """What a row of ``meshd peers`` (and the web console's map) shows of advert ``a``: who the
    node is, what it serves (each model's layer range, tier and weight format), its load, slots,
    speeds, hardware and Vivaldi coordinate."""
    return {
        "name": a.name,
        "peer_id": a.peer_id,
        "region": a.region,
        "labels": a.labels,
        "hardware": a.hardware,
        "models": [
            {"name": m.name, "layers": [m.layer_start, m.layer_end], "num_layers": m.num_layers,
             **({"tier": m.tier} if m.tier else {}),
             **({"fmt": m.weight_format} if m.weight_format else {}),
             **({"batch": m.batch_max, "batch_tps": list(m.batch_tps)} if m.batch_max else {}),
             # measured speed of this model there (0: not measured yet)
             "prefill_tps": m.prefill_tps, "decode_tps": m.decode_tps, "ttft_ms": m.ttft_ms,
             **({"ctx": m.context_length} if m.context_length else {}),
             **({"mid": m.model_id} if m.model_id else {}),
             **({"tok": m.tokenizer[:16]} if m.tokenizer else {}),
             # bytes of the sketch of the prompt prefixes its KV prefix cache holds
             # (docs/routing.md, "Prefix credit")
             **({"prefix_sketch_bytes": len(m.prefix_sketch)} if m.prefix_sketch else {})}
            for m in a.models
        ],
        "queue_depth": a.queue_depth,
        "in_flight": a.in_flight,
        "slots": a.max_concurrency,
        "prefill_tps": a.prefill_tps,
        "decode_tps": a.decode_tps,
        "seq": a.seq,
        "coord": {"vec": list(a.coord), "height": a.coord_height} if a.coord else None,
        "collections": list(a.collections),  # retrieval collections (docs/rag.md)
        "signals": signals_dict(read_signals(a.hardware)),
    }


def peers_listing(src: PeerSource, now: float) -> list[dict[str, Any]]:
    """Every peer of the table (stalled ones too), as ``meshd peers`` shows them at ``now``:
    ``cell`` (None when cells are off) and ``known_by``: ``advert`` (gossip or a SYNC: a member
    of our cell, or any peer when cells are off) or ``probe`` (a node of another cell that
    answered a probe)."""
    table, coord = src.table, src.coord
    rows = []
    for pid, e in sorted(table.entries.items()):
        a = e.advert
        rtt, source = peer_rtt(e, coord, now)
        remote = coord_of(a)
        est = estimate_rtt_ms(coord, remote) if remote is not None and len(remote.vec) == len(coord.vec) else None
        rows.append(
            {
                **advert_fields(a),
                "peer_id": pid,
                "cell": src.cell_of(pid, a.labels),
                "known_by": "probe" if src.via.get(pid) == "probe" else "advert",
                "advert_age_s": round(now - e.heard_at, 3),
                "rtt_ms": round(rtt, 3),
                "rtt_source": source,
                "rtt_measured_ms": round(e.rtt_ms, 3) if e.rtt_ms is not None else None,
                "rtt_estimated_ms": round(est, 3) if est is not None else None,
                "stalled": e.stalled,
            }
        )
    return rows
