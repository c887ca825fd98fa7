"""choose_range: table tests, convergence of nodes joining one by one, and no flapping;
MoveGate: a move needs the same target twice on the same picture."""

from __future__ import annotations

import random

import pytest

from meshd.core.placement import MoveGate, choose_range, outranked
from meshd.errors import ConfigError


def cov(num_layers: int, *ranges: tuple[int, int, float]) -> list[float]:
    out = [0.0] * num_layers
    for start, end, w in ranges:
        for i in range(start, end):
            out[i] += w
    return out


@pytest.mark.parametrize(
    ("layers", "cap", "heard", "current", "want"),
    [
        # Nothing heard: the first window.
        (12, 4, cov(12), None, (0, 4)),
        # Fill the gap.
        (12, 4, cov(12, (0, 4, 1), (8, 12, 1)), None, (4, 8)),
        # Capacity beyond the model: the whole model.
        (12, 20, cov(12), None, (0, 12)),
        # Weakest layers are 6-8: a window of 3 covers exactly them.
        (12, 3, cov(12, (0, 6, 2), (9, 12, 2), (6, 9, 1)), None, (6, 9)),
        # Everything covered equally: stay where we are.
        (12, 4, cov(12, (0, 12, 1)), (4, 8), (4, 8)),
        # A current range of the wrong size (capacity changed) is replaced.
        (12, 4, cov(12, (0, 12, 1)), (4, 6), (0, 4)),
        # Out of range (model changed depth): replaced.
        (8, 4, cov(8, (0, 8, 1)), (6, 10), (0, 4)),
        # Speed-weighted: a slow replica on 0-4 and a fast one on 4-8: back up the slow side.
        (8, 4, cov(8, (0, 4, 10.0), (4, 8, 40.0)), None, (0, 4)),
    ],
)
def test_choose_range(
    layers: int,
    cap: int,
    heard: list[float],
    current: tuple[int, int] | None,
    want: tuple[int, int],
) -> None:
    assert choose_range("m", layers, cap, heard, current, 0.5) == want


def test_moves_when_the_weakest_layer_clearly_gains() -> None:
    # Two nodes both on 0-6 of 12 layers: the one deciding moves to cover 6-12.
    heard = cov(12, (0, 6, 1))
    assert choose_range("m", 12, 6, heard, (0, 6), 0.5) == (6, 12)


def test_moves_to_leave_fewer_uncovered_layers() -> None:
    # 24 layers, capacity 8; another node on 8-16. We sit on 4-12 (overlapping it): the weakest
    # level stays 0 whatever we do, but 0-8 leaves 8 uncovered layers instead of 12.
    heard = cov(24, (8, 16, 1))
    assert choose_range("m", 24, 8, heard, (4, 12), 0.5) == (0, 8)


def test_stays_when_the_gain_is_below_hysteresis() -> None:
    # Coverage in tokens/s: others give layers 0-4 100 and 4-8 110; we add 50 on 4-8, so the
    # weakest layer has 100. Moving to 0-4 would raise it to 110: not worth reloading weights
    # with a hysteresis of 20, worth it with 5.
    heard = cov(8, (0, 4, 100.0), (4, 8, 110.0))
    assert choose_range("m", 8, 4, heard, (4, 8), 20.0, my_speed=50.0) == (4, 8)
    assert choose_range("m", 8, 4, heard, (4, 8), 5.0, my_speed=50.0) == (0, 4)


def test_no_flap_under_noisy_adverts() -> None:
    """Speeds re-measured with +-5% noise every round never make a settled node move."""
    rng = random.Random(11)
    base = cov(16, (0, 8, 100.0), (8, 16, 100.0))
    current = choose_range("m", 16, 8, base, None, 15.0, my_speed=100.0)
    moves = 0
    for _ in range(300):
        noisy = [c * rng.uniform(0.95, 1.05) for c in base]
        nxt = choose_range("m", 16, 8, noisy, current, 15.0, my_speed=100.0)
        moves += nxt != current
        current = nxt
    assert moves == 0


def test_no_two_ranges_each_look_better_than_the_other() -> None:
    """For any fixed picture, moving and then deciding again never moves back."""
    rng = random.Random(5)
    for _ in range(300):
        layers = rng.randint(4, 16)
        cap = rng.randint(1, layers)
        heard = [float(rng.randint(0, 3)) for _ in range(layers)]
        start = rng.randint(0, layers - cap)
        first = choose_range("m", layers, cap, heard, (start, start + cap), 0.5)
        assert choose_range("m", layers, cap, heard, first, 0.5) == first


def test_nodes_joining_one_by_one_cover_the_model_evenly_and_settle() -> None:
    layers, cap, nodes = 24, 8, 9
    placed: dict[int, tuple[int, int]] = {}

    def heard_by(me: int) -> list[float]:
        return cov(layers, *[(s, e, 1.0) for n, (s, e) in placed.items() if n != me])

    for n in range(nodes):
        placed[n] = choose_range("m", layers, cap, heard_by(n), None, 0.5)
    total = cov(layers, *[(s, e, 1.0) for s, e in placed.values()])
    assert min(total) == 3 and max(total) == 3
    # Later rounds: everyone re-decides with what it hears; nobody moves.
    for _ in range(3):
        for n in range(nodes):
            assert choose_range("m", layers, cap, heard_by(n), placed[n], 0.5) == placed[n]


def test_recovers_coverage_when_a_node_leaves() -> None:
    layers, cap = 12, 4
    placed = {0: (0, 4), 1: (4, 8), 2: (8, 12), 3: (0, 4)}
    del placed[2]  # the only node on 8-12 leaves
    heard = cov(layers, *[(s, e, 1.0) for n, (s, e) in placed.items() if n != 3])
    assert choose_range("m", layers, cap, heard, placed[3], 0.5) == (8, 12)


def test_gate_moves_on_the_second_identical_decision_only() -> None:
    gate = MoveGate()
    heard = cov(6, (2, 4, 1), (4, 6, 1))
    assert not gate.confirm("m", (2, 4), (0, 2), heard)
    assert gate.pending("m") == (0, 2)
    assert gate.confirm("m", (2, 4), (0, 2), heard)
    assert gate.pending("m") is None
    # after a move the next proposal starts over
    assert not gate.confirm("m", (0, 2), (4, 6), heard)


@pytest.mark.parametrize(
    "second",
    [
        ((2, 4), ((4, 6), cov(6, (2, 4, 1), (4, 6, 1)))),   # the picture refreshed: stay
        ((2, 4), ((0, 2), cov(6, (2, 4, 1), (4, 6, 2)))),   # same target, other picture
        ((2, 4), ((4, 6), cov(6, (0, 2, 1), (2, 4, 1)))),   # another target
    ],
)
def test_gate_forgets_a_proposal_the_next_decision_does_not_repeat(second: tuple) -> None:
    gate = MoveGate()
    assert not gate.confirm("m", (2, 4), (0, 2), cov(6, (2, 4, 1), (4, 6, 1)))
    current, (target, heard) = second
    assert not gate.confirm("m", current, target, heard)
    assert not gate.confirm("m", (2, 4), (0, 2), cov(6, (2, 4, 1), (4, 6, 1)))


def test_one_stale_picture_does_not_move_a_settled_node() -> None:
    """The CI failure of session 2: three nodes settled on 0-2, 2-4, 4-6; one decision of auto2
    still heard auto3's advert from before its move (0-2), so it left 0-2 and auto3 then had to
    move back. With the gate, one stale decision followed by a fresh one moves nobody."""
    layers, cap = 6, 2
    placed = {"a1": (2, 4), "a2": (0, 2), "a3": (4, 6)}
    gate = MoveGate()
    stale = cov(layers, (2, 4, 1), (0, 2, 1))  # a3 still heard on 0-2
    fresh = cov(layers, (2, 4, 1), (4, 6, 1))
    for heard in (stale, fresh, fresh):
        target = choose_range("m", layers, cap, heard, placed["a2"], 0.5)
        assert not gate.confirm("m", placed["a2"], target, heard)
    assert choose_range("m", layers, cap, stale, placed["a2"], 0.5) != placed["a2"]  # it would


@pytest.mark.parametrize(
    ("layers", "cap", "heard", "match"),
    [
        (0, 4, [], "num_layers"),
        (4, 0, [0.0] * 4, "room for no layer"),
        (4, 2, [0.0] * 3, "3 layers"),
    ],
)
def test_errors(layers: int, cap: int, heard: list[float], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        choose_range("m", layers, cap, heard, None)


def test_outranked_only_by_a_lower_peer_id_on_the_same_range() -> None:
    assert outranked("b", (0, 2), [("a", (0, 2))])
    assert not outranked("a", (0, 2), [("b", (0, 2))])
    assert not outranked("b", (0, 2), [("a", (2, 4))])
    assert not outranked("b", (0, 2), [])


def test_gate_waits_behind_a_senior_then_moves_after_patience() -> None:
    gate = MoveGate(patience=2)
    heard = cov(6, (0, 2, 1), (2, 4, 1))
    for _ in range(2):  # waiting for the senior on the same range
        assert not gate.confirm("m", (0, 2), (4, 6), heard, outranked=True)
    # patience spent (the senior's layers may be fixed): the usual two decisions move it
    assert not gate.confirm("m", (0, 2), (4, 6), heard, outranked=True)
    assert gate.confirm("m", (0, 2), (4, 6), heard, outranked=True)


def test_senior_moving_first_means_the_junior_never_moves() -> None:
    """Three nodes start on 0-2 of a 6-layer model. Each hears the others through a picture
    that lags (a loaded host): a move is heard only some decisions after it happened, and all
    decide in lock-step. Without seniority they never settle; with it, at lags below the
    patience, two nodes move once each, the third stays, and nobody moves again."""
    layers, cap = 6, 2
    ids = ["a", "b", "c"]
    placed = {i: (0, 2) for i in ids}
    lag = 4
    history: list[dict[str, tuple[int, int]]] = [dict(placed)] * (lag + 1)
    gates = {i: MoveGate() for i in ids}
    moves = {i: 0 for i in ids}
    for _ in range(60):
        seen = history[-1 - lag]
        for i in ids:
            others = [(j, seen[j]) for j in ids if j != i]
            heard = cov(layers, *((r[0], r[1], 1) for _, r in others))
            target = choose_range("m", layers, cap, heard, placed[i], 0.5)
            if gates[i].confirm("m", placed[i], target, heard, outranked(i, placed[i], others)):
                placed[i] = target
                moves[i] += 1
        history.append(dict(placed))
    assert sorted(placed.values()) == [(0, 2), (2, 4), (4, 6)]
    assert sum(moves.values()) == 2, moves
