"""The console's map (meshd/api/console/atlas.py), pure: projection, placement, spreading, the
states of nodes and the links between them."""

from __future__ import annotations

import math
from typing import Any

import pytest

from meshd.api.console.atlas import (
    MIN_GAP,
    fit,
    group_of,
    hardware_summary,
    mesh_map,
    place,
    project,
    ring,
    spread,
)
from meshd.api.console.source import MeshRows
from meshd.testing.fake_console import peer_row


def _dist(a: tuple[float, float], b: tuple[float, float]) -> float:
    return math.dist(a, b)


@pytest.mark.parametrize("vectors, expect", [
    ([], []),
    ([[1.0, 2.0, 3.0]], [(0.0, 0.0)]),
    ([[0.0, 0.0], [0.0, 0.0]], [(0.0, 0.0), (0.0, 0.0)]),  # no spread: the origin
    # points on a line in 3-D: one axis keeps all of it, the furthest point on the + side
    ([[0.0, 0.0, 0.0], [3.0, 4.0, 0.0], [6.0, 8.0, 0.0]], [(-5.0, 0.0), (0.0, 0.0), (5.0, 0.0)]),
])
def test_project_table(vectors: list[list[float]], expect: list[tuple[float, float]]) -> None:
    got = project(vectors)
    assert len(got) == len(expect)
    for g, e in zip(got, expect, strict=True):
        assert g == pytest.approx(e, abs=1e-6)


def test_project_keeps_distances_of_planar_points_in_8_dimensions() -> None:
    # a triangle lying in a plane of 8-D space: the projection keeps its three distances
    base = [[0.0] * 8, [30.0] + [0.0] * 7, [0.0, 0.0, 40.0] + [0.0] * 5]
    p = project(base)
    assert _dist(p[0], p[1]) == pytest.approx(30.0, rel=1e-6)
    assert _dist(p[0], p[2]) == pytest.approx(40.0, rel=1e-6)
    assert _dist(p[1], p[2]) == pytest.approx(50.0, rel=1e-6)


def test_projection_does_not_flip_when_the_nodes_are_listed_in_another_order() -> None:
    vecs = [[0.0, 0.0, 1.0], [10.0, 1.0, 0.0], [2.0, 12.0, 0.0], [-5.0, 3.0, 2.0]]
    a = project(vecs)
    b = project(list(reversed(vecs)))
    for x, y in zip(a, reversed(b), strict=True):
        assert x == pytest.approx(y, abs=1e-6)


def test_fit_puts_points_in_the_margins_and_keeps_their_shape() -> None:
    got = fit([(0.0, 0.0), (100.0, 0.0), (100.0, 50.0)], margin=0.1)
    assert all(0.1 - 1e-9 <= c <= 0.9 + 1e-9 for p in got for c in p)
    assert got[1][0] - got[0][0] == pytest.approx(0.8)  # the longer side fills the square
    assert got[2][1] - got[1][1] == pytest.approx(0.4)  # one scale for both axes


@pytest.mark.parametrize("n", [1, 2, 3, 7])
def test_ring_spaces_points_evenly(n: int) -> None:
    pts = ring(n, (0.5, 0.5), 0.2)
    assert len(pts) == n
    if n > 1:
        assert all(_dist(p, (0.5, 0.5)) == pytest.approx(0.2) for p in pts)
        gaps = {round(_dist(pts[i], pts[(i + 1) % n]), 9) for i in range(n)}
        assert len(gaps) == 1


@pytest.mark.parametrize("points", [
    [(0.5, 0.5)] * 5,  # all on one spot
    [(0.5, 0.5), (0.51, 0.5), (0.52, 0.51), (0.2, 0.2)],
    [(0.0, 0.0), (0.01, 0.0), (1.0, 1.0), (0.99, 1.0)],  # at the borders
])
def test_spread_leaves_no_two_points_closer_than_the_gap(points: list[tuple[float, float]]) -> None:
    got = spread(points)
    assert len(got) == len(points)
    for i in range(len(got)):
        for j in range(i + 1, len(got)):
            assert _dist(got[i], got[j]) >= MIN_GAP * 0.97, (i, j, got)
    assert all(0.04 <= c <= 0.96 for p in got for c in p)
    assert spread(points) == got  # deterministic


def test_spread_moves_nothing_already_apart() -> None:
    pts = [(0.2, 0.2), (0.8, 0.2), (0.5, 0.8)]
    assert spread(pts) == pts


def test_place_a_loopback_mesh_on_a_ring() -> None:
    rows = [peer_row(f"n{i}", f"p{i}", vec=(0.1 * i, 0.05)) for i in range(3)]  # spread < 2 ms
    got = place(rows)
    centre = (sum(p[0] for p in got) / 3, sum(p[1] for p in got) / 3)
    radii = [_dist(p, centre) for p in got]
    assert max(radii) - min(radii) < 1e-3 and min(radii) > 0.2


def test_place_follows_the_coordinates_when_they_spread() -> None:
    rows = [peer_row("a", "pa", vec=(0.0, 0.0)), peer_row("b", "pb", vec=(1.0, 0.0)),
            peer_row("far", "pf", vec=(80.0, 0.0))]
    a, b, far = place(rows)
    assert _dist(a, b) < _dist(a, far) / 3  # near ones near, the far one far
    assert _dist(a, b) >= MIN_GAP * 0.97  # yet apart enough to click


def test_place_puts_a_node_without_coordinates_with_its_group() -> None:
    rows = [peer_row("a", "pa", vec=(0.0, 0.0), region="eu"), peer_row("b", "pb", vec=(5.0, 0.0), region="eu"),
            peer_row("c", "pc", vec=(90.0, 0.0), region="us"), {**peer_row("s", "ps", region="us"), "coord": None}]
    a, b, c, s = place(rows)
    assert _dist(s, c) < _dist(s, a)


def test_groups_are_cells_then_regions() -> None:
    assert group_of({"cell": "c1", "region": "eu"}) == "c1"
    assert group_of({"cell": None, "region": "eu"}) == "eu"
    assert group_of({}) == ""


def test_mesh_map_states_links_and_groups() -> None:
    local = {**peer_row("me", "p0", vec=(0.0, 0.0)), "known_by": "self"}
    rows = MeshRows(
        local=local,
        peers=[peer_row("b", "p2", vec=(20.0, 0.0), rtt_ms=21.0),
               peer_row("a", "p1", vec=(0.0, 20.0), rtt_ms=None, rtt_estimated_ms=19.5, stalled=True)],
        departed=[{**peer_row("gone", "p3", vec=(10.0, 10.0)), "silent_s": 12.0},
                  {**peer_row("bad", "p4", vec=(5.0, 5.0)), "silent_s": 3.0}],
        revoked=frozenset({"p4"}))
    view = mesh_map(rows)
    states = {n["name"]: n["state"] for n in view["nodes"]}
    assert states == {"me": "self", "a": "stalled", "b": "live", "gone": "silent", "bad": "revoked"}
    assert [n["name"] for n in view["nodes"]] == ["me", "a", "b", "bad", "gone"]
    assert view["self"] == "p0"
    own = {(link["a"], link["b"]): link for link in view["links"] if link["a"] == "p0"}
    assert own[("p0", "p2")] == {"a": "p0", "b": "p2", "ms": 21.0, "measured": True}
    assert own[("p0", "p1")]["measured"] is False and own[("p0", "p1")]["ms"] == 19.5
    peer_links = [link for link in view["links"] if link["a"] != "p0"]
    assert len(peer_links) == 1 and not peer_links[0]["measured"]  # a - b, estimated
    assert peer_links[0]["ms"] == pytest.approx(math.dist((0, 20), (20, 0)) + 0.2, abs=1e-3)
    assert view["groups"] == [{"name": "local", "nodes": ["p0", "p1", "p2", "p4", "p3"]}]
    gone = next(n for n in view["nodes"] if n["name"] == "gone")
    assert gone["silent_s"] == 12.0
    assert all(0.0 <= n["x"] <= 1.0 and 0.0 <= n["y"] <= 1.0 for n in view["nodes"])


def test_hardware_summary() -> None:
    hw: dict[str, Any] = {
        "kind": "gpu", "cpu_cores": 16, "cpu_load_1m": 1.5, "memory_total_bytes": 64 << 30,
        "memory_available_bytes": 40 << 30, "power_w": 30.0, "throttle": ["cpu_thermal"],
        "thermal_c": {"cpu": 61.0, "board": 48.5}, "stale": ["nvml"],
        "gpus": [{"name": "H100", "memory_total_bytes": 80 << 30, "memory_free_bytes": 30 << 30,
                  "temperature_c": 71.0, "power_draw_w": 350.0, "power_limit_w": 700.0,
                  "throttle": ["sw_power_cap"], "utilisation_pct": 93.0}],
    }
    s = hardware_summary(hw)
    assert s["gpus"][0]["memory_used_bytes"] == 50 << 30
    assert s["gpus"][0]["temperature_c"] == 71.0 and s["gpus"][0]["throttle"] == ["sw_power_cap"]
    assert s["power_w"] == 380.0 and s["hottest_c"] == 61.0
    assert s["throttle"] == ["cpu_thermal"] and s["failing"] == ["nvml"]
    assert hardware_summary(None) == {}
    assert hardware_summary({"gpus": ["junk"], "thermal_c": {"x": "hot"}})["gpus"] == []
