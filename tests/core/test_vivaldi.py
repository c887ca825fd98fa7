"""Vivaldi coordinates: table tests of the formulas and a seeded simulation with accuracy bounds."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from meshd.core.vivaldi import (
    SOURCE_MEASURED,
    SOURCE_UNKNOWN,
    SOURCE_VIVALDI,
    Coord,
    RttBook,
    VivaldiConfig,
    choose_rtt,
    estimate_rtt_ms,
    median_filter,
    update,
)

CFG2 = VivaldiConfig(dimensionality=2, adjustment_window=0)


def c2(x: float, y: float, height: float = 0.0, error: float = 1.5, adj: float = 0.0) -> Coord:
    return Coord((x, y), height, error, adj)


@pytest.mark.parametrize(
    ("a", "b", "want"),
    [
        (c2(0, 0), c2(3, 4), 5.0),
        (c2(0, 0, height=1.0), c2(3, 4, height=2.0), 8.0),
        (c2(0, 0, adj=1.0), c2(3, 4, adj=0.5), 6.5),
        # A negative adjustment that would make the estimate negative is ignored.
        (c2(0, 0, adj=-10.0), c2(3, 4), 5.0),
        (c2(1, 1), c2(1, 1), 0.0),
    ],
)
def test_estimate_rtt(a: Coord, b: Coord, want: float) -> None:
    assert estimate_rtt_ms(a, b) == pytest.approx(want)
    assert estimate_rtt_ms(b, a) == pytest.approx(want)


def test_estimate_rejects_mixed_dimensions() -> None:
    with pytest.raises(ValueError, match="dimensions differ"):
        estimate_rtt_ms(c2(0, 0), Coord((0.0, 0.0, 0.0)))


@pytest.mark.parametrize(
    ("local", "remote", "rtt", "check"),
    [
        # Too close for the measured RTT: pushed away from the remote along the x axis.
        (c2(1, 0, error=1.0), c2(0, 0, error=1.0), 10.0, lambda c: c.vec[0] > 1.0),
        # Too far: pulled towards the remote.
        (c2(20, 0, error=1.0), c2(0, 0, error=1.0), 10.0, lambda c: c.vec[0] < 20.0),
        # Exactly right: does not move, and the error shrinks.
        (
            c2(10, 0, error=1.0),
            c2(0, 0, error=1.0),
            10.0,
            lambda c: c.vec == (10.0, 0.0) and c.error < 1.0,
        ),
        # A confident node barely moves for an unsure peer (weight 0.01/1.51).
        (c2(1, 0, error=0.01), c2(0, 0, error=1.5), 100.0, lambda c: c.vec[0] < 1.5),
        # An unsure node moves a lot towards a confident one's estimate.
        (c2(1, 0, error=1.5), c2(0, 0, error=0.01), 100.0, lambda c: c.vec[0] > 20.0),
    ],
)
def test_update_moves_the_right_way(local: Coord, remote: Coord, rtt: float, check: object) -> None:
    new = update(local, remote, rtt, CFG2, random.Random(1))
    assert callable(check) and check(new), new


@pytest.mark.parametrize("rtt", [math.nan, math.inf, -1.0])
def test_update_ignores_invalid_samples(rtt: float) -> None:
    local = c2(1, 2, error=0.5)
    assert update(local, c2(0, 0), rtt, CFG2) == local


def test_update_ignores_invalid_remote() -> None:
    local = c2(1, 2, error=0.5)
    assert update(local, c2(math.nan, 0), 10.0, CFG2) == local


def test_update_from_coincident_points_uses_jitter_direction() -> None:
    origin = Coord.origin(CFG2)
    moved = update(origin, origin, 10.0, CFG2, (0.0, 1.0))
    assert moved.vec[0] == pytest.approx(0.0)
    assert moved.vec[1] > 0.0
    # Without jitter it still moves (along the first axis), deterministically.
    assert update(origin, origin, 10.0, CFG2).vec[0] > 0.0
    with pytest.raises(ValueError, match="jitter"):
        update(origin, origin, 10.0, CFG2, (1.0,))


def test_height_and_error_stay_within_bounds() -> None:
    cfg = VivaldiConfig(dimensionality=2)
    c = Coord.origin(cfg)
    rng = random.Random(3)
    for _ in range(200):
        c = update(
            c,
            c2(rng.uniform(-5, 5), rng.uniform(-5, 5), 0.01, 1.5),
            rng.uniform(0.0, 1e4),
            cfg,
            rng,
        )
        assert c.height >= cfg.height_min_ms
        assert 0.0 <= c.error <= cfg.error_max
        assert c.is_valid()


def test_gravity_pulls_towards_origin() -> None:
    far = c2(1000.0, 0.0, error=1.0)
    free = update(far, c2(999.0, 0.0, error=1.0), 1.0, CFG2)
    pulled = update(
        far,
        c2(999.0, 0.0, error=1.0),
        1.0,
        VivaldiConfig(2, gravity_rho_ms=150.0, adjustment_window=0),
    )
    assert pulled.vec[0] < free.vec[0]


def test_update_is_pure_and_deterministic() -> None:
    a, b = c2(1, 2, error=1.0), c2(4, 6, error=0.5)
    assert update(a, b, 7.0, CFG2, random.Random(5)) == update(a, b, 7.0, CFG2, random.Random(5))
    assert a == c2(1, 2, error=1.0)


@pytest.mark.parametrize(
    ("samples", "want"),
    [([5.0], 5.0), ([1.0, 9.0], 5.0), ([10.0, 1000.0, 11.0], 11.0), ([4.0, 1.0, 3.0, 2.0], 2.5)],
)
def test_median_filter(samples: list[float], want: float) -> None:
    assert median_filter(samples) == want


def test_median_filter_rejects_empty() -> None:
    with pytest.raises(ValueError):
        median_filter([])


A, B = c2(0, 0, error=0.2), c2(30, 40, error=0.2)


@pytest.mark.parametrize(
    ("measured", "age", "local", "remote", "want"),
    [
        (12.0, 1.0, A, B, (12.0, SOURCE_MEASURED)),  # fresh measurement wins
        (12.0, 31.0, A, B, (50.0, SOURCE_VIVALDI)),  # stale: the estimate
        (12.0, 31.0, None, B, (12.0, SOURCE_MEASURED)),  # stale but nothing better
        (None, None, A, B, (50.0, SOURCE_VIVALDI)),
        (None, None, A, None, (100.0, SOURCE_UNKNOWN)),
        (None, None, A, Coord((0.0, 0.0, 0.0)), (100.0, SOURCE_UNKNOWN)),  # dimensions differ
        (None, None, A, c2(math.nan, 0), (100.0, SOURCE_UNKNOWN)),
    ],
)
def test_choose_rtt(
    measured: float | None,
    age: float | None,
    local: Coord | None,
    remote: Coord | None,
    want: tuple[float, str],
) -> None:
    assert choose_rtt(measured, age, local, remote, max_age_s=30.0) == want


def test_rtt_book() -> None:
    book = RttBook(local=A).with_coord("p1", B).with_sample("p2", 7.0, at_s=100.0)
    assert book.lookup("p1", now_s=100.0) == (50.0, SOURCE_VIVALDI)
    assert book.lookup("p2", now_s=110.0) == (7.0, SOURCE_MEASURED)
    assert book.lookup("p3", now_s=110.0) == (100.0, SOURCE_UNKNOWN)
    fresher = book.with_sample("p1", 45.0, at_s=200.0)
    assert fresher.lookup("p1", now_s=210.0) == (45.0, SOURCE_MEASURED)
    assert fresher.lookup("p1", now_s=260.0) == (50.0, SOURCE_VIVALDI)
    assert book.lookup("p1", now_s=210.0) == (50.0, SOURCE_VIVALDI)  # the old book is unchanged
    assert book.with_local(B).local == B


# --- seeded simulation: 3 regions x 4 nodes ---------------------------------------------------


def _world(rng: random.Random) -> tuple[list[list[float]], list[int]]:
    """RTTs of 5-20 ms inside a region and 60-150 ms across, with per-node access delays."""
    between = {(0, 1): 70.0, (0, 2): 140.0, (1, 2): 100.0}
    region = [r for r in range(3) for _ in range(4)]
    access = [rng.uniform(2.5, 8.0) for _ in region]
    n = len(region)
    m = [[0.0] * n for _ in range(n)]
    for i in range(n):
        for j in range(i + 1, n):
            if region[i] == region[j]:
                v = access[i] + access[j] + rng.uniform(0.0, 4.0)
            else:
                v = (
                    between[(region[i], region[j])]
                    + (access[i] + access[j]) / 2
                    + rng.uniform(-5, 5)
                )
            m[i][j] = m[j][i] = v
    return m, region


def _simulate(seed: int, rounds: int) -> tuple[list[float], list[float], list[list[float]]]:
    rng = random.Random(seed)
    m, region = _world(rng)
    n = len(region)
    cfg = VivaldiConfig()
    coords = [Coord.origin(cfg) for _ in range(n)]
    for _ in range(rounds):
        for i in range(n):
            j = rng.randrange(n - 1)
            j += j >= i
            sample = m[i][j] * (1.0 + rng.uniform(0.0, 0.1)) + rng.expovariate(1.0)  # jitter
            coords[i] = update(coords[i], coords[j], sample, cfg, rng)
    err_all, err_in = [], []
    for i in range(n):
        for j in range(n):
            if i != j:
                e = abs(estimate_rtt_ms(coords[i], coords[j]) - m[i][j]) / m[i][j]
                err_all.append(e)
                if region[i] == region[j]:
                    err_in.append(e)
    return err_all, err_in, m


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_converges_from_the_origin_within_15_percent(seed: int) -> None:
    # 60 samples per node (a minute of one ping per second) from every node at the origin.
    err_all, _, m = _simulate(seed, rounds=60)
    flat = [v for row in m for v in row if v > 0]
    assert min(flat) >= 5.0 and max(flat) <= 155.0
    assert statistics.median(err_all) < 0.15


def test_in_region_estimates_improve_with_more_samples() -> None:
    _, early, _ = _simulate(7, rounds=20)
    _, late, _ = _simulate(7, rounds=300)
    assert statistics.median(late) < statistics.median(early)
    assert statistics.median(late) < 0.25
