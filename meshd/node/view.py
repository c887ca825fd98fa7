"""Build the routing snapshot (``MeshSnapshot``) from the peer table and the local node."""

from __future__ import annotations

from meshd.core.advert import Advert
from meshd.core.peertable import PeerEntry
from meshd.core.snapshot import MeshSnapshot, NodeView, Serving
from meshd.core.vivaldi import Coord, choose_rtt

MEASURED_MAX_AGE_S = 30.0


def coord_of(a: Advert) -> Coord | None:
    if not a.coord:
        return None
    return Coord(tuple(a.coord), a.coord_height, a.coord_error, a.coord_adjustment)


def view_of_advert(a: Advert, *, rtt_ms: float, rtt_source: str, age_s: float,
                   sent_since_advert: int, is_local: bool) -> NodeView:
    return NodeView(
        peer_id=a.peer_id,
        name=a.name,
        region=a.region,
        labels=frozenset(f"{k}={v}" for k, v in a.labels.items()) | frozenset(
            v for k, v in a.labels.items() if k in ("region", "residency")
        ) | frozenset(t for k, v in a.labels.items() if k == "residency" for t in v.split(",")),
        serving=tuple(
            Serving(m.name, m.num_layers, m.layer_start, m.layer_end,
                    m.prefill_ms_per_layer_token, m.decode_ms_per_layer) for m in a.models
        ),
        queue_depth=a.queue_depth,
        in_flight=a.in_flight,
        max_concurrency=a.max_concurrency,
        max_queue=a.max_queue,
        prefill_tps=a.prefill_tps or 1000.0,
        decode_tps=a.decode_tps or 50.0,
        rtt_ms=rtt_ms,
        rtt_source=rtt_source,
        advert_age_s=age_s,
        sent_since_advert=sent_since_advert,
        cost_per_hour=a.cost_per_hour,
        free_kv_tokens=min((m.free_kv_tokens for m in a.models), default=1 << 30) or 1 << 30,
        is_local=is_local,
    )


def peer_rtt(entry: PeerEntry, local: Coord | None, now: float) -> tuple[float, str]:
    age = now - entry.rtt_at if entry.rtt_ms is not None else None
    return choose_rtt(entry.rtt_ms, age, local, coord_of(entry.advert), max_age_s=MEASURED_MAX_AGE_S)


def build_snapshot(local_advert: Advert, entries: list[PeerEntry], local_coord: Coord | None,
                   now: float) -> MeshSnapshot:
    nodes = [view_of_advert(local_advert, rtt_ms=0.0, rtt_source="local", age_s=0.0,
                            sent_since_advert=0, is_local=True)]
    for e in entries:
        rtt, src = peer_rtt(e, local_coord, now)
        nodes.append(view_of_advert(e.advert, rtt_ms=rtt, rtt_source=src,
                                    age_s=max(0.0, now - e.heard_at),
                                    sent_since_advert=e.sent_since_advert, is_local=False))
    nodes.sort(key=lambda n: n.peer_id)
    return MeshSnapshot(local_peer_id=local_advert.peer_id, nodes=tuple(nodes))
