"""Build the routing snapshot (``MeshSnapshot``) from the peer table and the local node.

A daemon builds one per request, with every peer of its table in it. What a peer's view takes
from its advert (labels, serving ranges, load, speeds, its coordinate) is derived once per advert
and kept in the entry's ``memo``, and the Vivaldi estimate to it once per (advert, local
coordinate); only what depends on the time (the advert's age, whether the measured RTT is still
fresh) and the count of requests sent since the advert are taken anew for each snapshot. The
result is the very snapshot that deriving everything afresh gives (tests check it).
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Mapping
from typing import Protocol

from meshd.core import predict
from meshd.core.advert import Advert
from meshd.core.hwsignals import read_signals, with_signals
from meshd.core.peertable import PeerEntry, PeerTable
from meshd.core.routing import residency_allows
from meshd.core.snapshot import MeshSnapshot, NodeView, Serving
from meshd.core.vivaldi import (
    SOURCE_MEASURED,
    SOURCE_UNKNOWN,
    SOURCE_VIVALDI,
    Coord,
    choose_rtt,
    estimate_rtt_ms,
)

MEASURED_MAX_AGE_S = 30.0
UNKNOWN_RTT_MS = 100.0  # choose_rtt's default, used when nothing is known


class MeshView(Protocol):
    """The mesh as a request's path reads it: the peer table and a fresh routing snapshot
    (``meshd.node.membership.Membership``)."""

    table: PeerTable
    labels: dict[str, str]  # this node's certificate labels

    def snapshot(self) -> MeshSnapshot: ...

    def local_advert(self) -> Advert: ...


def coord_of(a: Advert) -> Coord | None:
    if not a.coord:
        return None
    return Coord(tuple(a.coord), a.coord_height, a.coord_error, a.coord_adjustment)


def view_of_advert(a: Advert, *, rtt_ms: float, rtt_source: str, age_s: float,
                   sent_since_advert: int, is_local: bool) -> NodeView:
    """The node of advert ``a`` as routing sees it, with its live hardware signals applied
    (``meshd.core.hwsignals.with_signals``: throttling slows its speeds)."""
    return with_signals(_view(a, rtt_ms=rtt_ms, rtt_source=rtt_source, age_s=age_s,
                              sent_since_advert=sent_since_advert, is_local=is_local),
                        read_signals(a.hardware))


def routing_labels(labels: Mapping[str, str]) -> frozenset[str]:
    """A certificate's labels as routing matches them (``residency_allows``): ``key=value``,
    the bare region and residency values, and each tag of a comma-separated residency."""
    return frozenset(f"{k}={v}" for k, v in labels.items()) | frozenset(
        v for k, v in labels.items() if k in ("region", "residency")
    ) | frozenset(t for k, v in labels.items() if k == "residency" for t in v.split(","))


def labels_allow(labels: Mapping[str, str], residency: str | None) -> bool:
    """Whether a node with these certificate labels may serve a request with ``residency``
    (None or empty: any node), as the router decides (``residency_allows``)."""
    return not residency or residency_allows(routing_labels(labels), residency)


def _view(a: Advert, *, rtt_ms: float, rtt_source: str, age_s: float,
          sent_since_advert: int, is_local: bool) -> NodeView:
    return NodeView(
        peer_id=a.peer_id,
        name=a.name,
        region=a.region,
        labels=routing_labels(a.labels),
        serving=tuple(
            Serving(m.name, m.num_layers, m.layer_start, m.layer_end,
                    m.prefill_ms_per_layer_token, m.decode_ms_per_layer, m.kv_bytes_per_token,
                    m.model_id, m.prefix_sketch)
            for m in a.models
        ),
        queue_depth=a.queue_depth,
        in_flight=a.in_flight,
        max_concurrency=a.max_concurrency,
        max_queue=a.max_queue,
        prefill_tps=a.prefill_tps or 1000.0,
        decode_tps=_decode_tps(a),
        rtt_ms=rtt_ms,
        rtt_source=rtt_source,
        advert_age_s=age_s,
        sent_since_advert=sent_since_advert,
        cost_per_hour=a.cost_per_hour,
        free_kv_tokens=min((m.free_kv_tokens for m in a.models), default=1 << 30) or 1 << 30,
        is_local=is_local,
        service_rate_rps=a.service_rate_rps,
    )


def _decode_tps(a: Advert) -> float:
    """One stream's decode speed there: from the node's batch curve at the streams it runs now
    plus this one (predict.batched_decode_tps), else its advertised per-stream speed."""
    fallback = a.decode_tps or 50.0
    m = next((m for m in a.models if m.batch_max and any(x > 0 for x in m.batch_tps)), None)
    if m is None:
        return fallback
    return predict.batched_decode_tps(m.batch_tps, min(a.in_flight + 1, m.batch_max), fallback)


def peer_rtt(entry: PeerEntry, local: Coord | None, now: float) -> tuple[float, str]:
    age = now - entry.rtt_at if entry.rtt_ms is not None else None
    return choose_rtt(entry.rtt_ms, age, local, coord_of(entry.advert), max_age_s=MEASURED_MAX_AGE_S)


# NodeView's fields in order; the four taken anew for each snapshot are consecutive.
_FIELDS = tuple(f.name for f in dataclasses.fields(NodeView))
_PER_SNAPSHOT_AT = _FIELDS.index("rtt_ms")
assert _FIELDS[_PER_SNAPSHOT_AT:_PER_SNAPSHOT_AT + 4] == (
    "rtt_ms", "rtt_source", "advert_age_s", "sent_since_advert"
)


class _PeerMemo:
    """What one peer's view takes from its advert, and the Vivaldi estimate to it from the local
    coordinate ``local`` (both kept in ``PeerEntry.memo`` while the advert is the same object)."""

    __slots__ = ("advert", "head", "tail", "remote", "local", "vivaldi")

    def __init__(self, a: Advert) -> None:
        v = view_of_advert(a, rtt_ms=0.0, rtt_source=SOURCE_UNKNOWN, age_s=0.0,
                           sent_since_advert=0, is_local=False)
        self.advert = a
        values = [getattr(v, f) for f in _FIELDS]
        self.head = tuple(values[:_PER_SNAPSHOT_AT])  # NodeView's fields before rtt_ms
        self.tail = tuple(values[_PER_SNAPSHOT_AT + 4:])  # ... and after sent_since_advert
        remote = coord_of(a)
        self.remote = remote if remote is not None and remote.is_valid() else None
        self.local: Coord | None = None
        self.vivaldi: float | None = None  # None: no estimate (no or invalid coordinates)

    def estimate(self, local: Coord | None, local_valid: bool) -> float | None:
        """``choose_rtt``'s Vivaldi estimate to this peer from ``local``, or None."""
        if self.local is not local:
            self.local = local
            r = self.remote
            self.vivaldi = (
                estimate_rtt_ms(local, r)
                if local is not None and local_valid and r is not None and len(r.vec) == len(local.vec)
                else None
            )
        return self.vivaldi


_PEER_ID = operator.attrgetter("peer_id")


def build_snapshot(local_advert: Advert, entries: list[PeerEntry], local_coord: Coord | None,
                   now: float) -> MeshSnapshot:
    """The snapshot of the local node and ``entries`` at ``now``: the same, field for field, as
    ``view_of_advert`` and ``peer_rtt`` give for each entry (see the module docstring)."""
    nodes = [view_of_advert(local_advert, rtt_ms=0.0, rtt_source="local", age_s=0.0,
                            sent_since_advert=0, is_local=True)]
    local_valid = local_coord is not None and local_coord.is_valid()
    append = nodes.append
    for e in entries:
        a = e.advert
        m = e.memo
        if not isinstance(m, _PeerMemo) or m.advert is not a:
            m = e.memo = _PeerMemo(a)
        # choose_rtt: a fresh measurement, else the estimate, else a stale one, else unknown
        measured = e.rtt_ms
        if measured is not None and now - e.rtt_at <= MEASURED_MAX_AGE_S:
            rtt, src = measured, SOURCE_MEASURED
        else:
            est = m.estimate(local_coord, local_valid)
            if est is not None:
                rtt, src = est, SOURCE_VIVALDI
            elif measured is not None:
                rtt, src = measured, SOURCE_MEASURED
            else:
                rtt, src = UNKNOWN_RTT_MS, SOURCE_UNKNOWN
        append(NodeView(*m.head, rtt, src, max(0.0, now - e.heard_at),  # type: ignore[call-arg]
                        e.sent_since_advert, *m.tail))
    nodes.sort(key=_PEER_ID)
    return MeshSnapshot(local_peer_id=local_advert.peer_id, nodes=tuple(nodes))
