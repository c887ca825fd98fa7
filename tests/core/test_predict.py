"""Table tests of the prediction formulas."""

from __future__ import annotations

import math

import pytest

from meshd.core import predict


@pytest.mark.parametrize(
    ("tokens", "tps", "want"),
    [(100, 1000.0, 100.0), (0, 1000.0, 0.0), (1, 50.0, 20.0), (10, 0.0, math.inf), (-3, 10.0, 0.0)],
)
def test_prefill_ms(tokens: int, tps: float, want: float) -> None:
    assert predict.prefill_ms(tokens, tps) == pytest.approx(want)


@pytest.mark.parametrize(("tps", "want"), [(50.0, 20.0), (1000.0, 1.0), (0.0, math.inf)])
def test_decode_ms_per_token(tps: float, want: float) -> None:
    assert predict.decode_ms_per_token(tps) == want


@pytest.mark.parametrize(
    ("prompt", "out", "pf", "dc", "want"),
    [
        (100, 1, 1000.0, 50.0, 100.0),  # the first token comes with the prefill
        (100, 11, 1000.0, 50.0, 300.0),  # + 10 decode steps of 20 ms
        (0, 0, 1000.0, 50.0, 0.0),
        (100, 11, 1000.0, 0.0, math.inf),
    ],
)
def test_service_time_ms(prompt: int, out: int, pf: float, dc: float, want: float) -> None:
    assert predict.service_time_ms(prompt, out, pf, dc) == pytest.approx(want)


@pytest.mark.parametrize(
    ("slots", "prompt", "out", "want"),
    [
        (1, 100, 11, 1000.0 / 300.0),
        (4, 100, 11, 4000.0 / 300.0),
        (0, 100, 11, 1000.0 / 300.0),
        (2, 0, 0, math.inf),
    ],
)
def test_service_rate_rps(slots: int, prompt: int, out: int, want: float) -> None:
    assert predict.service_rate_rps(slots, prompt, out, 1000.0, 50.0) == pytest.approx(want)


@pytest.mark.parametrize(("q", "f", "s", "want"), [(0, 0, 0, 0), (3, 2, 1, 6), (-1, 2, 0, 2)])
def test_load(q: int, f: int, s: int, want: int) -> None:
    assert predict.load(q, f, s) == want


@pytest.mark.parametrize(
    ("load", "slots", "rate", "want"),
    [
        (0, 1, 2.0, 0.0),  # idle: starts at once
        (3, 4, 2.0, 0.0),  # a slot is free
        (4, 4, 2.0, 500.0),  # all slots busy: wait for one completion at 2/s
        (9, 4, 2.0, 3000.0),  # 5 queued + 1 completion
        (1.5, 1, 2.0, 750.0),  # fractional loads after the staleness correction
        (4, 4, 0.0, math.inf),
        (4, 0, 2.0, 2000.0),  # no slots declared counts as one
    ],
)
def test_queue_wait_ms(load: float, slots: int, rate: float, want: float) -> None:
    assert predict.queue_wait_ms(load, slots, rate) == pytest.approx(want)


def test_predicted_ttft_is_the_sum() -> None:
    assert predict.predicted_ttft_ms(12.0, 500.0, 80.0) == 592.0


@pytest.mark.parametrize(
    ("adv", "target", "age", "relax", "want"),
    [
        (10.0, 2.0, 0.0, 1.0, 10.0),  # fresh: as advertised
        (10.0, 2.0, 1.0, 1.0, 2.0 + 8.0 / math.e),
        (0.0, 4.0, 1.0, 1.0, 4.0 - 4.0 / math.e),  # an idle node fills up towards the typical
        (10.0, 2.0, 100.0, 1.0, pytest.approx(2.0)),  # very old: the typical load
        (10.0, 2.0, 5.0, 0.0, 10.0),  # correction off
        (10.0, 2.0, 5.0, math.inf, 10.0),
    ],
)
def test_stale_load(adv: float, target: float, age: float, relax: float, want: float) -> None:
    assert predict.stale_load(adv, target, age, relax) == pytest.approx(want)


@pytest.mark.parametrize(
    ("cph", "tps", "want"),
    [(3.6, 1.0, 1.0), (0.36, 100.0, 0.001), (0.0, 10.0, 0.0), (1.0, 0.0, math.inf)],
)
def test_cost_per_1k_tokens(cph: float, tps: float, want: float) -> None:
    assert predict.cost_per_1k_tokens(cph, tps) == pytest.approx(want)


@pytest.mark.parametrize(
    ("cph", "ms", "slots", "want"),
    [
        (3.6, 1000.0, 1, 0.001),
        (3.6, 1000.0, 4, 0.00025),
        (0.0, 1000.0, 1, 0.0),
        (3.6, 1000.0, 0, 0.001),
    ],
)
def test_request_cost(cph: float, ms: float, slots: int, want: float) -> None:
    assert predict.request_cost(cph, ms, slots) == pytest.approx(want)


@pytest.mark.parametrize(
    ("prompt", "after_first", "pf", "dc", "want_s"),
    [
        (100, 10, 1000.0, 50.0, 0.3),  # 0.1 s of prefill + 10 decode steps of 20 ms
        (100, 0, 1000.0, 50.0, 0.1),  # one token: the prefill only
        (0, 4, 1000.0, 40.0, 0.1),
        (37.5, 2.5, 250.0, 5.0, 0.65),  # the simulator's mean lengths are fractional
    ],
)
def test_slot_s_is_prefill_plus_the_tokens_after_the_first(
    prompt: float, after_first: float, pf: float, dc: float, want_s: float
) -> None:
    got = predict.slot_s(prompt, after_first, pf, dc)
    assert got == pytest.approx(want_s)
    assert got == predict.prefill_s(prompt, pf) + predict.decode_s(after_first, dc)
    # the same slot time as service_time_ms, in seconds, for whole token counts
    if after_first == int(after_first) and prompt == int(prompt):
        ms = predict.service_time_ms(int(prompt), int(after_first) + 1, pf, dc)
        assert got * 1000.0 == pytest.approx(ms)


@pytest.mark.parametrize(
    ("slots", "service_ms", "want"),
    [(4, 500.0, 8.0), (0, 500.0, 2.0), (1, 0.0, math.inf), (2, -1.0, math.inf), (1, math.nan, math.inf)],
)
def test_rate_from_service_ms(slots: int, service_ms: float, want: float) -> None:
    assert predict.rate_from_service_ms(slots, service_ms) == want


@pytest.mark.parametrize(
    ("curve", "batch", "want"),
    [
        ((), 4, 30.0),  # no curve: the advertised per-stream speed
        ((0.0, 0.0), 4, 30.0),  # nothing measured
        ((40.0, 70.0, 120.0, 160.0), 1, 40.0),
        ((40.0, 70.0, 120.0, 160.0), 4, 30.0),  # 120 tok/s shared by 4
        ((40.0, 70.0, 120.0, 160.0), 6, 140.0 / 6),  # halfway between 4 (120) and 8 (160)
        ((40.0, 70.0, 120.0, 160.0), 16, 10.0),  # saturated past 8: 160 shared by 16
        ((0.0, 70.0, 0.0, 160.0), 1, 35.0),  # below the first measured size: its per-stream
        ((0.0, 70.0, 0.0, 160.0), 4, 25.0),  # 70 + (160 - 70) * 2 / 6 = 100, shared by 4
        ((40.0, 70.0), 0, 40.0),
    ],
)
def test_batched_decode_tps(curve: tuple[float, ...], batch: int, want: float) -> None:
    assert predict.batched_decode_tps(curve, batch, 30.0) == pytest.approx(want)
