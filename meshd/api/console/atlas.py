"""The console's map of the mesh: every node this node knows, where its Vivaldi coordinate puts
it, grouped by cell or region, with the links between them. Pure: rows in, a JSON-able map out.

Placement. A Vivaldi coordinate is a point in 8 dimensions (plus a height) whose distances
predict round-trip times. The map shows the plane that keeps most of that spread: the two
principal axes of the nodes' coordinates (``project``), each axis's sign fixed so that its
largest component is positive (the map does not flip between updates). The plane
is scaled into the unit square. A mesh whose coordinates all lie within ``MIN_SPREAD_MS`` of
each other (a testnet on loopback: they are noise) is drawn as a ring per group instead, as are
nodes without a coordinate (known only through a cell's summary); ``spread`` then pushes apart
any two nodes closer than ``min_gap`` so that every node stays visible and clickable.

Links. This node to each peer: its measured RTT where pings measured it, else the Vivaldi
estimate. Peer to peer (meshes of at most ``MAX_PEER_LINKS_NODES`` nodes): the Vivaldi estimate
only, since this node measures no other pair.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from meshd.api.console.source import MeshRows

MIN_SPREAD_MS = 2.0  # coordinates closer than this (all of them) are not worth a projection
MAX_PEER_LINKS_NODES = 24  # past this many nodes only this node's own links are drawn
MIN_GAP = 0.09  # in the unit square: nodes closer than this are pushed apart
MARGIN = 0.12  # the unit square's border kept free (labels)
SPREAD_ROUNDS = 60

Point = tuple[float, float]


def project(vectors: Sequence[Sequence[float]]) -> list[Point]:
    """The 2-D coordinates of ``vectors`` on their two principal axes (units as given: ms);
    fewer than two vectors, or vectors without spread, give the origin."""
    if not vectors:
        return []
    m = np.asarray(vectors, dtype=float)
    if m.ndim != 2 or m.shape[0] < 2 or m.shape[1] == 0:
        return [(0.0, 0.0)] * len(vectors)
    centred = m - m.mean(axis=0)
    cov = centred.T @ centred
    values, axes = np.linalg.eigh(cov)  # ascending eigenvalues
    order = np.argsort(values)[::-1][:2]
    out = np.zeros((m.shape[0], 2))
    for k, i in enumerate(order):
        if values[i] <= 1e-12:
            continue
        axis = axes[:, i]
        if axis[int(np.argmax(np.abs(axis)))] < 0:  # its largest component positive
            axis = -axis
        out[:, k] = centred @ axis
    return [(round(float(x), 6), round(float(y), 6)) for x, y in out]


def fit(points: Sequence[Point], margin: float = MARGIN) -> list[Point]:
    """``points`` scaled (one factor for both axes) and moved into [margin, 1 - margin]^2,
    centred."""
    if not points:
        return []
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    extent = max(max(xs) - min(xs), max(ys) - min(ys))
    cx, cy = (max(xs) + min(xs)) / 2, (max(ys) + min(ys)) / 2
    scale = (1 - 2 * margin) / extent if extent > 0 else 0.0
    return [(0.5 + (x - cx) * scale, 0.5 + (y - cy) * scale) for x, y in points]


def ring(n: int, centre: Point, radius: float, phase: float = 0.0) -> list[Point]:
    """``n`` points evenly on a circle (one point: the centre), the first at the top."""
    if n == 1:
        return [centre]
    return [(centre[0] + radius * math.sin(phase + 2 * math.pi * i / n),
             centre[1] - radius * math.cos(phase + 2 * math.pi * i / n)) for i in range(n)]


def spread(points: Sequence[Point], min_gap: float = MIN_GAP, rounds: int = SPREAD_ROUNDS,
           bounds: tuple[float, float] = (0.04, 0.96)) -> list[Point]:
    """Push apart every two points closer than ``min_gap`` (each moves half the shortfall,
    along the line between them, or sideways when they coincide), keeping them within
    ``bounds``. Deterministic: pairs in index order; points already far enough never move."""
    pts = [list(p) for p in points]
    lo, hi = bounds
    for _ in range(rounds):
        moved = False
        for i in range(len(pts)):
            for j in range(i + 1, len(pts)):
                dx, dy = pts[j][0] - pts[i][0], pts[j][1] - pts[i][1]
                d = math.hypot(dx, dy)
                if d >= min_gap - 1e-9:
                    continue
                if d < 1e-9:  # coincident: split them along a direction fixed by the pair
                    angle = (i * 7 + j * 13) % 360 * math.pi / 180
                    dx, dy, d = math.cos(angle), math.sin(angle), 1.0
                    push = min_gap / 2
                else:
                    push = (min_gap - d) / 2
                ux, uy = dx / d, dy / d
                pts[i][0] -= ux * push
                pts[i][1] -= uy * push
                pts[j][0] += ux * push
                pts[j][1] += uy * push
                moved = True
        for p in pts:
            p[0] = min(hi, max(lo, p[0]))
            p[1] = min(hi, max(lo, p[1]))
        if not moved:
            break
    return [(round(p[0], 4), round(p[1], 4)) for p in pts]


def group_of(row: Mapping[str, Any]) -> str:
    """The cell a node is in, else its region, else ""."""
    return str(row.get("cell") or row.get("region") or "")


def _coord(row: Mapping[str, Any]) -> tuple[list[float], float] | None:
    c = row.get("coord")
    if not isinstance(c, Mapping):
        return None
    vec = c.get("vec")
    if not isinstance(vec, list) or not vec or not all(isinstance(x, int | float) for x in vec):
        return None
    if not all(math.isfinite(x) for x in vec):
        return None
    h = c.get("height")
    return [float(x) for x in vec], float(h) if isinstance(h, int | float) else 0.0


def place(rows: Sequence[Mapping[str, Any]]) -> list[Point]:
    """Where each row goes in the unit square (see the module's docstring)."""
    coords = [_coord(r) for r in rows]
    dims = {len(c[0]) for c in coords if c is not None}
    with_coord = [i for i, c in enumerate(coords) if c is not None]
    pos: dict[int, Point] = {}
    if len(dims) == 1 and len(with_coord) >= 2:
        projected = project([coords[i][0] for i in with_coord])  # type: ignore[index]
        xs = [p[0] for p in projected]
        ys = [p[1] for p in projected]
        if max(max(xs) - min(xs), max(ys) - min(ys)) >= MIN_SPREAD_MS:
            pos = dict(zip(with_coord, fit(projected), strict=True))
    groups = sorted({group_of(r) for r in rows})
    if not pos:  # no usable coordinates: a ring of groups, each a ring of its nodes
        centres = ring(len(groups), (0.5, 0.5), 0.27 if len(groups) > 1 else 0.0)
        for g, centre in zip(groups, centres, strict=True):
            members = [i for i, r in enumerate(rows) if group_of(r) == g]
            radius = (0.3 if len(groups) == 1 else 0.12) if len(members) > 1 else 0.0
            for i, p in zip(members, ring(len(members), centre, radius), strict=True):
                pos[i] = p
    else:  # a node without a coordinate goes to its group's centre, else the middle
        for i, r in enumerate(rows):
            if i in pos:
                continue
            mates = [pos[j] for j in pos if group_of(rows[j]) == group_of(r)]
            pos[i] = (sum(p[0] for p in mates) / len(mates), sum(p[1] for p in mates) / len(mates)) \
                if mates else (0.5, 0.5)
    return spread([pos[i] for i in range(len(rows))])


def hardware_summary(hw: Any) -> dict[str, Any]:
    """The figures of a hardware map (``meshd.telemetry.Hardware.to_dict``) the console shows:
    CPU and memory, each GPU's memory, temperature, power and throttling, the node's power, its
    hottest thermal zone, and the readers that are failing."""
    if not isinstance(hw, Mapping):
        return {}
    gpus: list[dict[str, Any]] = []
    watts = 0.0
    for g in hw.get("gpus") or []:
        if not isinstance(g, Mapping):
            continue
        total, free = _num(g.get("memory_total_bytes")), _num(g.get("memory_free_bytes"))
        gpus.append({"name": g.get("name"), "memory_total_bytes": total,
                     "memory_used_bytes": _num(g.get("memory_used_bytes"))
                     if g.get("memory_used_bytes") is not None
                     else (total - free if total is not None and free is not None else None),
                     "shared_memory": bool(g.get("shared_memory")),
                     "temperature_c": _num(g.get("temperature_c")),
                     "utilisation_pct": _num(g.get("utilisation_pct")),
                     "power_w": _num(g.get("power_draw_w")), "power_limit_w": _num(g.get("power_limit_w")),
                     "throttle": [str(t) for t in g.get("throttle") or []]})
        watts += _num(g.get("power_draw_w")) or 0.0
    thermal = hw.get("thermal_c")
    temps = [float(v) for v in thermal.values() if _num(v) is not None] \
        if isinstance(thermal, Mapping) else []
    power = watts + (_num(hw.get("power_w")) or 0.0)
    return {"kind": hw.get("kind"), "cpu_cores": hw.get("cpu_cores"),
            "cpu_load_1m": _num(hw.get("cpu_load_1m")),
            "memory_total_bytes": _num(hw.get("memory_total_bytes")),
            "memory_available_bytes": _num(hw.get("memory_available_bytes")),
            "gpus": gpus, "power_w": round(power, 1) if power else None,
            "hottest_c": max(temps) if temps else None,
            "throttle": [str(t) for t in hw.get("throttle") or []],
            "failing": [str(s) for s in hw.get("stale") or []]}


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) else None


def _state(row: Mapping[str, Any], departed: bool, revoked: frozenset[str]) -> str:
    if row.get("peer_id") in revoked:
        return "revoked"
    if departed:
        return "silent"
    if row.get("known_by") == "self":
        return "self"
    return "stalled" if row.get("stalled") else "live"


def _node(row: Mapping[str, Any], state: str, xy: Point) -> dict[str, Any]:
    return {
        "id": row.get("peer_id"), "name": row.get("name"), "state": state,
        "x": xy[0], "y": xy[1], "group": group_of(row), "region": row.get("region") or "",
        "cell": row.get("cell"), "known_by": row.get("known_by"), "labels": row.get("labels") or {},
        "models": [{k: m.get(k) for k in ("name", "layers", "num_layers", "tier", "fmt", "batch")
                    if m.get(k) is not None} for m in row.get("models") or [] if isinstance(m, Mapping)],
        "queue_depth": row.get("queue_depth"), "in_flight": row.get("in_flight"),
        "slots": row.get("slots"), "decode_tps": row.get("decode_tps"),
        "prefill_tps": row.get("prefill_tps"),
        "advert_age_s": row.get("advert_age_s"), "silent_s": row.get("silent_s"),
        "rtt_ms": row.get("rtt_ms"), "rtt_source": row.get("rtt_source"),
        "rtt_measured_ms": row.get("rtt_measured_ms"),
        "height_ms": (row.get("coord") or {}).get("height") if isinstance(row.get("coord"), Mapping) else None,
        "hardware": hardware_summary(row.get("hardware")),
    }


def mesh_map(rows: MeshRows) -> dict[str, Any]:
    """The map of ``rows``: ``nodes`` (this node first, then peers by name), ``links`` and
    ``groups`` (name -> node ids, sorted)."""
    listed: list[tuple[Mapping[str, Any], bool]] = [(rows.local, False)]
    listed += sorted(((p, False) for p in rows.peers), key=lambda t: (str(t[0].get("name")), str(t[0].get("peer_id"))))
    listed += sorted(((p, True) for p in rows.departed), key=lambda t: (str(t[0].get("name")), str(t[0].get("peer_id"))))
    positions = place([r for r, _ in listed])
    nodes = [_node(r, _state(r, gone, rows.revoked), xy)
             for (r, gone), xy in zip(listed, positions, strict=True)]
    local_id = rows.local.get("peer_id")
    links: list[dict[str, Any]] = []
    for p in rows.peers:
        measured = _num(p.get("rtt_measured_ms"))
        ms = measured if measured is not None else _num(p.get("rtt_estimated_ms"))
        if ms is not None and p.get("known_by") != "summary":
            links.append({"a": local_id, "b": p.get("peer_id"), "ms": round(ms, 3),
                          "measured": measured is not None})
    live = [r for r, gone in listed[1:] if not gone and r.get("known_by") != "summary"]
    if len(live) <= MAX_PEER_LINKS_NODES:
        for i, a in enumerate(live):
            for b in live[i + 1:]:
                ca, cb = _coord(a), _coord(b)
                if ca is None or cb is None or len(ca[0]) != len(cb[0]):
                    continue
                est = math.dist(ca[0], cb[0]) + ca[1] + cb[1]
                links.append({"a": a.get("peer_id"), "b": b.get("peer_id"), "ms": round(est, 3),
                              "measured": False})
    groups: dict[str, list[Any]] = {}
    for n in nodes:
        groups.setdefault(n["group"], []).append(n["id"])
    return {"self": local_id, "nodes": nodes, "links": links,
            "groups": [{"name": g, "nodes": ids} for g, ids in sorted(groups.items())]}
