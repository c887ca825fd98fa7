"""The probe gate's view of its own cell (``meshd.node.cells.Cells.local_best_ms``): members are
scored as the cell's summary scores them (``member_wait_ms``, ``whole_models``) and reached at the
RTT the router would use (``meshd.node.view.peer_rtt``, which ages out old measurements)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import trio
import trio.testing

from meshd.config import Config
from meshd.core.advert import Advert, ModelAdvert
from meshd.core.peertable import PeerTable
from meshd.core.vivaldi import Coord, estimate_rtt_ms
from meshd.node.cells import Cells, member_wait_ms, whole_models
from meshd.node.view import MEASURED_MAX_AGE_S

WALL = 1000.0


def advert(pid: str, *, start: int = 0, queue: int = 0, coord: tuple[float, ...] = (),
           labels: dict[str, str] | None = None) -> Advert:
    return Advert(
        peer_id=pid, name=pid, seq=1, ts=WALL, region="eu", labels=labels or {},
        models=(ModelAdvert("m", 6, start, 6, 800.0, 40.0, 1000),),
        queue_depth=queue, in_flight=0, max_concurrency=1, max_queue=16, prefill_tps=800.0,
        decode_tps=40.0, cost_per_hour=0.0, coord=coord, coord_height=1.0, coord_error=0.2,
        coord_adjustment=0.0,
    )  # fmt: skip


def cells_for(local: Advert, peers: list[Advert], coord: Coord, now: float) -> Cells:
    table = PeerTable(local.peer_id, expiry_s=1e9)
    for a in peers:
        table.apply(a, now, WALL)
    m = SimpleNamespace(cell="eu", peer_id=local.peer_id, local_advert=lambda: local, table=table,
                        via={}, coord=coord, labels=local.labels)
    return Cells(Config(), SimpleNamespace(), m)  # type: ignore[arg-type]


def run(fn):  # trio.current_time() needs a running loop; the clock starts at 0
    out = []

    async def main() -> None:
        out.append(fn())

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    return out[0]


def test_members_are_scored_as_the_summary_scores_them() -> None:
    busy_self = advert("self", queue=6)
    slice_only = advert("slice", start=3)
    free = advert("free", coord=(10.0, 0.0, 0.0, 0.0))
    assert whole_models(slice_only) == [] and whole_models(free) == ["m"]
    coord = Coord((0.0, 0.0, 0.0, 0.0), 1.0, 0.2, 0.0)

    def best() -> float:
        c = cells_for(busy_self, [slice_only, free], coord, 0.0)
        return c.local_best_ms("m")

    got = run(best)
    vivaldi = estimate_rtt_ms(coord, Coord(free.coord, 1.0, 0.2, 0.0))
    assert math.isclose(got, vivaldi + member_wait_ms(free))
    assert member_wait_ms(busy_self) > got  # the busy self is not the best; the slice never counts
    assert run(lambda: cells_for(busy_self, [slice_only], coord, 0.0).local_best_ms("nope")) == math.inf


def test_an_old_measurement_gives_way_to_the_estimate_as_the_router_does() -> None:
    local = advert("self", queue=50)
    peer = advert("peer", coord=(20.0, 0.0, 0.0, 0.0))
    coord = Coord((0.0, 0.0, 0.0, 0.0), 1.0, 0.2, 0.0)
    vivaldi = estimate_rtt_ms(coord, Coord(peer.coord, 1.0, 0.2, 0.0))

    def best(measured_at: float) -> float:
        c = cells_for(local, [peer], coord, 0.0)
        c.membership.table.record_rtt("peer", 3.0, measured_at)
        return c.local_best_ms("m") - member_wait_ms(peer)

    assert math.isclose(run(lambda: best(0.0)), 3.0)  # fresh: the measurement
    assert math.isclose(run(lambda: best(-MEASURED_MAX_AGE_S - 1.0)), vivaldi)  # aged out


def test_residency_leaves_out_members_it_does_not_allow() -> None:
    local = advert("self", queue=50, labels={"region": "us"})
    us = advert("us", labels={"region": "us"})
    de = advert("de", queue=4, labels={"residency": "eu/de"})
    coord = Coord((0.0, 0.0, 0.0, 0.0), 1.0, 0.2, 0.0)

    def best(residency: str | None) -> float:
        c = cells_for(local, [us, de], coord, 0.0)
        for pid in ("us", "de"):
            c.membership.table.record_rtt(pid, 5.0, 0.0)
        return c.local_best_ms("m", residency)

    assert math.isclose(run(lambda: best(None)), 5.0 + member_wait_ms(us))
    assert math.isclose(run(lambda: best("eu")), 5.0 + member_wait_ms(de))
    assert member_wait_ms(de) > member_wait_ms(us)
    assert run(lambda: best("asia")) == math.inf


# -- residency: the reach step's "need" and the skip held per (model, residency) -----------

class _Cells:
    def __init__(self) -> None:
        self.calls: list[tuple[str, bool, str | None]] = []

    async def reach(self, model: str, *, need: bool, residency: str | None = None) -> None:
        self.calls.append((model, need, residency))


def test_a_cell_whose_members_the_residency_excludes_needs_the_probes() -> None:
    from meshd.node.entry.reach import reach

    here = advert("self", labels={"region": "us"})
    mate = advert("mate", labels={"region": "us"})
    table = PeerTable(here.peer_id, expiry_s=1e9)
    table.apply(mate, 0.0, WALL)
    cells = _Cells()
    node = SimpleNamespace(cells=cells, runner=SimpleNamespace(get=lambda m: object(),
                                                                 default_model=lambda: "m"),
                           membership=SimpleNamespace(table=table, labels=here.labels))
    for residency in (None, "us", "eu"):
        ctx = SimpleNamespace(model="m", req=SimpleNamespace(model="m", residency=residency))
        trio.run(reach, ctx, node)
    # served here and by the cell-mate, but neither may serve a request that must stay in the EU
    assert cells.calls == [("m", False, None), ("m", False, "us"), ("m", True, "eu")]


def test_a_skip_without_residency_does_not_hold_back_a_request_with_one() -> None:
    local = advert("self", labels={"region": "us"})
    coord = Coord((0.0, 0.0, 0.0, 0.0), 1.0, 0.2, 0.0)

    async def main() -> dict[str, int]:
        c = cells_for(local, [], coord, 0.0)
        await c.reach("m", need=False)  # no other cell to win: skipped for this interval
        await c.reach("m", need=False)  # ... and held
        await c.reach("m", need=False, residency="eu")  # decided anew for its own residency
        return c.stats

    stats = trio.run(main, clock=trio.testing.MockClock())
    assert stats["probes_skipped"] == 2 and stats["probe_rounds"] == 0
