"""The daemon's per-request work kept exact: the snapshot builder's per-peer memo
(``meshd.node.view``), the peer table's version counter and cached ``live()`` list, and the
pipeline planner skipped when the mesh has no stage ranges (``meshd.core.decide.choose_pipeline``)."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest

from meshd.core import decide as decide_mod
from meshd.core.advert import Advert, ModelAdvert
from meshd.core.decide import choose_pipeline, whole_only
from meshd.core.peertable import PeerEntry, PeerTable
from meshd.core.snapshot import MeshSnapshot, NodeView, Policy, RouteRequest, Serving
from meshd.core.vivaldi import Coord
from meshd.errors import RoutingError
from meshd.node.view import build_snapshot, coord_of, peer_rtt, view_of_advert

WALL = 1000.0


def fresh_snapshot(local: Advert, entries: list[PeerEntry], coord: Coord | None,
                   now: float) -> MeshSnapshot:
    """Every view derived afresh from its entry (what build_snapshot did before its memo)."""
    nodes = [view_of_advert(local, rtt_ms=0.0, rtt_source="local", age_s=0.0,
                            sent_since_advert=0, is_local=True)]
    for e in entries:
        rtt, src = peer_rtt(e, coord, now)
        nodes.append(view_of_advert(e.advert, rtt_ms=rtt, rtt_source=src,
                                    age_s=max(0.0, now - e.heard_at),
                                    sent_since_advert=e.sent_since_advert, is_local=False))
    nodes.sort(key=lambda n: n.peer_id)
    return MeshSnapshot(local_peer_id=local.peer_id, nodes=tuple(nodes))


def advert(i: int, seq: int, rng: random.Random, coord: tuple[float, ...] | None = None) -> Advert:
    return Advert(
        peer_id=f"p{i:04d}", name=f"node-{i}", seq=seq, ts=WALL, region=f"r{i % 3}",
        labels={"region": f"r{i % 3}", "residency": "eu,eu/de"} if i % 2 else {"gpu": "a"},
        models=(ModelAdvert("m", 6, 0, 6 if i % 3 else 3, 1.5, 0.5, rng.randint(0, 5000)),),
        queue_depth=rng.randint(0, 9), in_flight=rng.randint(0, 4), max_concurrency=4,
        max_queue=16, prefill_tps=rng.choice([0.0, 800.0]), decode_tps=40.0,
        cost_per_hour=0.5,
        coord=coord if coord is not None else tuple(rng.uniform(-50, 50) for _ in range(4)),
        coord_height=1.0, coord_error=0.4, coord_adjustment=rng.uniform(-1, 1),
    )  # fmt: skip


def check(table: PeerTable, local: Advert, coord: Coord | None, now: float) -> MeshSnapshot:
    got = build_snapshot(local, table.live(), coord, now)
    want = fresh_snapshot(local, table.live(), coord, now)
    assert got == want
    # the same floats, bit for bit (== would let -0.0 and 0.0 pass)
    assert [(n.rtt_ms.hex(), n.advert_age_s.hex()) for n in got.nodes] == [
        (n.rtt_ms.hex(), n.advert_age_s.hex()) for n in want.nodes
    ]
    return got


def test_cached_snapshot_equals_a_fresh_one_after_every_kind_of_change() -> None:
    rng = random.Random(7)
    local = advert(0, 1, rng)
    coord = coord_of(local)
    assert coord is not None
    t = PeerTable(local.peer_id, expiry_s=60.0)
    for i in range(1, 30):
        t.apply(advert(i, 1, rng), rng.uniform(0.0, 2.0), WALL)
    seen = [t.version]

    def changed() -> None:
        assert t.version > seen[-1], "the change did not bump the table's version"
        seen.append(t.version)

    snap = check(t, local, coord, 3.0)
    assert {n.rtt_source for n in snap.nodes} == {"local", "vivaldi"}
    check(t, local, coord, 4.5)  # time alone: every age moves, memo reused
    assert all(e.memo is not None for e in t.live())
    t.record_rtt("p0003", 12.5, 4.0)
    changed()
    snap = check(t, local, coord, 5.0)
    assert snap.by_id("p0003").rtt_source == "measured"  # type: ignore[union-attr]
    check(t, local, coord, 4.0 + 30.0)  # exactly at the limit: still measured
    snap = check(t, local, coord, 4.0 + 30.001)  # stale: the estimate wins again
    assert snap.by_id("p0003").rtt_source == "vivaldi"  # type: ignore[union-attr]
    t.note_sent("p0004")
    t.note_sent("p0004")
    changed()
    assert check(t, local, coord, 6.0).by_id("p0004").sent_since_advert == 2  # type: ignore[union-attr]
    old = t.get("p0005").memo  # type: ignore[union-attr]
    t.apply(advert(5, 2, rng), 6.5, WALL)  # a new advert: a new memo
    changed()
    check(t, local, coord, 7.0)
    assert t.get("p0005").memo is not old  # type: ignore[union-attr]
    t.apply(advert(99, 1, rng), 7.0, WALL)  # a new peer
    changed()
    check(t, local, coord, 7.5)
    t.mark_stalled("p0006")
    changed()
    assert "p0006" not in {n.peer_id for n in check(t, local, coord, 8.0).nodes}
    assert t.drop("p0007")
    changed()
    check(t, local, coord, 8.0)
    assert not t.drop("p0007")
    assert t.version == seen[-1]  # nothing changed, nothing bumped
    # our own coordinate moved (a new object): estimates are taken again
    coord2 = replace(coord, vec=tuple(x + 3.0 for x in coord.vec))
    snap = check(t, local, coord2, 9.0)
    assert snap.by_id("p0008").rtt_ms != build_snapshot(local, t.live(), coord, 9.0).by_id(  # type: ignore[union-attr]
        "p0008").rtt_ms  # fmt: skip
    check(t, local, None, 9.0)  # no coordinate: measured (stale or not) or unknown
    t.apply(advert(8, 2, rng, coord=(math.nan, 0.0, 0.0, 0.0)), 9.0, WALL)  # invalid coordinate
    t.record_rtt("p0009", 40.0, 9.0)
    t.apply(advert(9, 2, rng, coord=()), 9.5, WALL)  # none gossiped, a measurement kept
    snap = check(t, local, coord2, 100.0)
    assert snap.by_id("p0008").rtt_source == "unknown"  # type: ignore[union-attr]
    assert snap.by_id("p0009").rtt_source == "measured"  # type: ignore[union-attr]
    check(t, local, replace(coord2, height=math.inf), 100.0)  # our coordinate invalid
    assert t.expire(100.0)  # every peer is older than the expiry
    changed()
    assert check(t, local, coord2, 100.0).nodes == (
        view_of_advert(local, rtt_ms=0.0, rtt_source="local", age_s=0.0, sent_since_advert=0,
                       is_local=True),
    )


def test_live_is_kept_per_version_and_each_call_gets_its_own_list() -> None:
    rng = random.Random(1)
    t = PeerTable("me", expiry_s=60.0)
    for i in (3, 1, 2):
        t.apply(advert(i, 1, rng), 0.0, WALL)
    a = t.live()
    a.clear()  # a caller's list is its own
    assert [e.advert.peer_id for e in t.live()] == ["p0001", "p0002", "p0003"]
    t.mark_stalled("p0002")
    assert [e.advert.peer_id for e in t.live()] == ["p0001", "p0003"]
    t.apply(advert(2, 2, rng), 1.0, WALL)  # an advert brings a stalled peer back
    assert [e.advert.peer_id for e in t.live()] == ["p0001", "p0002", "p0003"]
    t.drop("p0001")
    assert [e.advert.peer_id for e in t.live()] == ["p0002", "p0003"]
    assert [e.advert.peer_id for e in t.known()] == ["p0002", "p0003"]


# ---------------------------------------------------------------- choose_pipeline's shortcut


def random_snapshot(rng: random.Random, n: int, partial: bool) -> MeshSnapshot:
    nodes = []
    for i in range(n):
        if partial and i % 3 == 1:
            a = rng.randint(0, 4)
            serving: tuple[Serving, ...] = (Serving("m", 6, a, rng.randint(a + 1, 6), 0.3, 0.2),)
        elif i % 7 == 6:
            serving = (Serving("other", 4, 0, 4),)
        else:
            serving = (Serving("m", 6, 0, 6, rng.choice([0.0, 0.2]), rng.choice([0.0, 0.1])),)
        nodes.append(NodeView(
            peer_id=f"p{i:04d}", name=f"n{i}", labels=frozenset({"eu"} if i % 2 else {"us"}),
            serving=serving, queue_depth=rng.randint(0, 6), in_flight=rng.randint(0, 3),
            max_concurrency=2, max_queue=rng.choice([4, 64]), prefill_tps=800.0,
            decode_tps=rng.uniform(10, 60), rtt_ms=0.0 if i == 0 else rng.uniform(1, 150),
            rtt_source="local" if i == 0 else "vivaldi", advert_age_s=rng.uniform(0, 3),
            free_kv_tokens=rng.choice([100, 1 << 20]), is_local=i == 0,
        ))  # fmt: skip
    return MeshSnapshot("p0000", tuple(nodes))


def outcome(f: object, *args: object) -> object:
    try:
        return f(*args)  # type: ignore[operator]
    except RoutingError as e:
        return ("RoutingError", str(e))


@pytest.mark.parametrize("seed", range(40))
def test_choose_pipeline_gives_what_planning_gives(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(seed)
    partial = seed % 2 == 1  # then node 1 serves a stage range
    snap = random_snapshot(rng, rng.choice([3, 12, 40] if partial else [1, 3, 12, 40]), partial)
    reqs = [
        RouteRequest("r", "m", rng.randint(1, 400), rng.randint(1, 100)),
        RouteRequest("r", "m", 50, 20, residency="eu"),
        RouteRequest("r", "m", 50, 20, residency="mars"),  # excludes every node
        RouteRequest("r", "m", 50, 20, exclude=frozenset(n.peer_id for n in snap.nodes[:5])),
        RouteRequest("r", "nobody-serves-this", 50, 20),
    ]
    policies = [Policy(), Policy(model_allow=frozenset({"other"}))]
    for req in reqs:
        for policy in policies:
            for mode in ("auto", "always"):
                with monkeypatch.context() as m:  # without the shortcut: always plan
                    m.setattr(decide_mod, "whole_only", lambda snap, model: False)
                    want = outcome(choose_pipeline, req, snap, policy, mode)
                got = outcome(choose_pipeline, req, snap, policy, mode)
                assert got == want, (req, policy, mode)
            assert choose_pipeline(req, snap, policy, "never") is None
    # and the shortcut is taken exactly when the mesh has no stage ranges of the model
    skipped = whole_only(snap, "m")
    assert skipped == (not partial)

    def planned(*args: object) -> object:
        raise AssertionError("planned although no stage range exists")

    if skipped:
        monkeypatch.setattr(decide_mod, "plan", planned)
        for req in reqs[:4]:
            assert choose_pipeline(req, snap, Policy(), "auto") is None


def test_whole_only_cases() -> None:
    whole = NodeView("a", "a", serving=(Serving("m", 6, 0, 6),))
    half = NodeView("b", "b", serving=(Serving("m", 6, 0, 3), Serving("x", 2, 0, 2)))
    other = NodeView("c", "c", serving=(Serving("x", 2, 0, 2),))
    assert whole_only(MeshSnapshot("a", (whole, other)), "m")
    assert not whole_only(MeshSnapshot("a", (whole, half)), "m")  # a chain may exist
    assert not whole_only(MeshSnapshot("a", (other,)), "m")  # nothing serves it: plan explains
    assert not whole_only(MeshSnapshot("a", ()), "m")
    assert whole_only(MeshSnapshot("a", (half,)), "x")
