"""How fast a finished answer is prefilled again to keep its KV (meshd.core.answer_keep)."""

from __future__ import annotations

import pytest

from meshd.core.answer_keep import answer_chunk, answer_seconds


def test_a_whole_chunk_with_no_stream_and_a_quarter_of_the_step_beside_streams() -> None:
    assert answer_chunk(0.0, 0.0, 128, streams=0) == 128  # idle: speeds do not matter
    # a GPU-like device: a 40 ms step, 0.05 ms a prefill token: a quarter is 200 tokens
    assert answer_chunk(40.0, 0.05, 128, streams=8) == 128
    assert answer_chunk(40.0, 0.3, 128, streams=8) == 32  # 33 tokens fit: whole 16s
    # a CPU: a 27 ms step for 8 streams, 1.6 ms a prefill token: 4 tokens fit, so none
    assert answer_chunk(27.0, 1.6, 128, streams=8) == 0
    assert answer_chunk(0.0, 0.05, 128, streams=1) == 0  # the step not measured yet


def test_the_simulators_view_at_steady_speeds() -> None:
    assert answer_seconds(250, 0.025, 5000.0, streams=0) == pytest.approx(0.05)
    # beside 8 streams of a 25 ms step: 31 tokens fit, so 16 a step, 16 steps, each 28.2 ms
    assert answer_seconds(250, 0.025, 5000.0, streams=8) == pytest.approx(16 * (0.025 + 16 / 5000))
    assert answer_seconds(250, 0.1, 100.0, streams=2) is None  # waits for an idle step
    assert answer_seconds(0, 0.1, 100.0, streams=2) == 0.0
