"""What ``meshd status`` and ``meshd peers`` show: the node and its peer table, as plain data."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import trio

from meshd.core.vivaldi import estimate_rtt_ms
from meshd.node.view import coord_of, peer_rtt

if TYPE_CHECKING:
    from meshd.node.node import Node


def node_status(self: Node) -> dict[str, Any]:
    return {
        "name": self.node_name,
        "peer_id": self.peer_id,
        "region": self.region,
        "labels": self.labels,
        "addrs": self.addrs,
        "uptime_s": round(time.time() - self.started_at, 1),
        "peers": len(self.table),
        "queue_depth": self.runner.queue_depth(),
        "in_flight": self.runner.in_flight(),
        "models": [s.statistics() for s in self.runner.models.values()],
        "hardware": self.hardware.to_dict() if self.hardware is not None else {},
        "strategy": self.policy.strategy,
        "api_url": getattr(self, "api_url", None),  # set by meshd.api.server when it listens
        "coord": {"vec": list(self.coord.vec), "height": self.coord.height, "error": self.coord.error},
        "services": {
            "node": dict(self.stats),
            "advert_rejections": dict(self.rejections),
            "gossip": dict(self.gossip.stats) if self.gossip else {},
            "advert_delay_ms": delay_summary(self.advert_delays_ms, self.stats["adverts_timed"]),
            "attestation": self.attestor.statistics(),
            "links": self.links.statistics() if self.links else {},
            "request_server": dict(self.server.stats),
            "stage_server": self.stage_server.statistics(),
            "placement": self.placer.statistics(),
            "entry": self.entry.statistics(),
            "cache": self.edge_cache.statistics(),
            "upstreams": {s.name: s.model.statistics() for s in self.runner.models.values()
                          if hasattr(s.model, "base_url")},  # [[models]] upstream
            "tokenizers": self.tokenizers.statistics(),
        },
    }

def peers_listing(self: Node) -> list[dict[str, Any]]:
    now = trio.current_time()
    rows = []
    for pid, e in sorted(self.table.entries.items()):
        a = e.advert
        rtt, source = peer_rtt(e, self.coord, now)
        remote = coord_of(a)
        est = estimate_rtt_ms(self.coord, remote) if remote is not None and len(remote.vec) == len(self.coord.vec) else None
        rows.append(
            {
                "name": a.name,
                "peer_id": pid,
                "region": a.region,
                "labels": a.labels,
                "hardware": a.hardware,
                "models": [
                    {"name": m.name, "layers": [m.layer_start, m.layer_end], "num_layers": m.num_layers}
                    for m in a.models
                ],
                "queue_depth": a.queue_depth,
                "in_flight": a.in_flight,
                "prefill_tps": a.prefill_tps,
                "decode_tps": a.decode_tps,
                "advert_age_s": round(now - e.heard_at, 3),
                "seq": a.seq,
                "rtt_ms": round(rtt, 3),
                "rtt_source": source,
                "rtt_measured_ms": round(e.rtt_ms, 3) if e.rtt_ms is not None else None,
                "rtt_estimated_ms": round(est, 3) if est is not None else None,
                "stalled": e.stalled,
            }
        )
    return rows


def delay_summary(samples: Any, total: int) -> dict[str, Any]:
    """Publish-to-receipt delay of recent adverts heard by gossip: p50/p99 over the recent
    samples, the samples, and ``n`` = how many were ever taken (the recent ones are a ring)."""
    xs = sorted(samples)
    if not xs:
        return {"n": total, "p50": None, "p99": None, "recent": []}

    def pct(q: float) -> float:
        return round(float(xs[min(len(xs) - 1, int(q * len(xs)))]), 3)

    return {"n": total, "p50": pct(0.5), "p99": pct(0.99), "recent": [round(x, 3) for x in samples]}
