"""The augmented prompt and its trimming rule (meshd.core.augment), as tables, and the RAG_PART
decoder's caps: garbage raises only ProtocolError."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshd.core.augment import (
    MAX_CHUNK_CHARS,
    MAX_K,
    Passage,
    build_prompt,
    fit_passages,
    passages_from_wire,
    passages_to_wire,
    trim_order,
)
from meshd.errors import ProtocolError


def ps(*scores: float, size: int = 10) -> list[Passage]:
    return [Passage(f"doc{i}.md:1-2", s, "t" * size) for i, s in enumerate(scores)]


def words(kept: Sequence[Passage]) -> int:
    """A stand-in tokenizer: the question costs 10, each passage its text length."""
    return 10 + sum(len(p.text) for p in kept)


def test_the_prompt_numbers_passages_with_their_sources_before_the_question() -> None:
    out = build_prompt("Why?", [Passage("a.md:1-3", 0.9, "Alpha."), Passage("b.py:7-9", 0.5, "Beta.")])
    assert out.index("[1] (source: a.md:1-3)\nAlpha.") < out.index("[2] (source: b.py:7-9)\nBeta.")
    assert out.endswith("Question: Why?")
    assert build_prompt("Why?", []) == "Why?"


@pytest.mark.parametrize(("scores", "order"), [
    ((0.9, 0.5, 0.7), [1, 2, 0]),
    ((0.5, 0.5, 0.9), [1, 0, 2]),  # a tie: the later one first
    ((), []),
])
def test_trim_order(scores: tuple[float, ...], order: list[int]) -> None:
    assert trim_order(ps(*scores)) == order


@pytest.mark.parametrize(("scores", "max_tokens", "context", "kept", "dropped"), [
    ((0.9, 0.8, 0.7), 10, 100, (0, 1, 2), ()),  # 10 + 30 + 10 = 50 fits
    ((0.9, 0.8, 0.7), 60, 100, (0, 1, 2), ()),  # 10 + 30 + 60 = 100: fits exactly
    ((0.9, 0.8, 0.7), 61, 100, (0, 1), (2,)),
    ((0.7, 0.9, 0.8), 75, 100, (1,), (0, 2)),  # the lowest scores go first, wherever they are
    ((0.9, 0.8), 85, 100, (), (1, 0)),  # nothing fits: the question alone
    ((0.9, 0.8), 10_000, None, (0, 1), ()),  # unknown context: nothing trimmed
])
def test_fit_trims_the_lowest_scores_first(scores: tuple[float, ...], max_tokens: int,
                                           context: int | None, kept: tuple[int, ...],
                                           dropped: tuple[int, ...]) -> None:
    fit = fit_passages(ps(*scores), words, max_tokens, context)
    assert (fit.kept, fit.dropped) == (kept, dropped)
    assert fit.prompt_tokens == words([ps(*scores)[i] for i in kept])
    if context is not None:
        assert fit.prompt_tokens + max_tokens <= context
    assert (fit.note is not None) == bool(dropped)
    if dropped:
        assert f"{len(dropped)} of {len(scores)}" in str(fit.note)


def test_wire_round_trip_and_caps() -> None:
    passages = ps(0.9, 0.4)
    assert passages_from_wire(passages_to_wire(passages)) == passages
    long = [Passage("s", 0.5, "x" * (MAX_CHUNK_CHARS + 10))] * (MAX_K + 5)
    wire = passages_to_wire(long)
    assert len(wire) <= MAX_K and all(len(c["text"]) <= MAX_CHUNK_CHARS for c in wire)
    passages_from_wire(wire)  # what we send, we accept


@pytest.mark.parametrize("raw", [
    None, {}, [1], [{"source": "s", "score": "high", "text": "t"}],
    [{"source": "s", "score": float("nan"), "text": "t"}], [{"source": 1, "score": 1, "text": "t"}],
    [{"source": "s", "score": True, "text": "t"}], [{"source": "s", "score": 1}],
    [{"source": "s", "score": 1, "text": "t"}] * (MAX_K + 1),
    [{"source": "s", "score": 1, "text": "x" * (MAX_CHUNK_CHARS + 1)}],
])
def test_bad_parts_are_protocol_errors(raw: Any) -> None:
    with pytest.raises(ProtocolError):
        passages_from_wire(raw)


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.sampled_from(["source", "score", "text", "x"]), inner,
                                      max_size=4), max_leaves=12))
def test_the_decoder_raises_only_protocol_errors(raw: Any) -> None:
    try:
        passages_from_wire(raw)
    except ProtocolError:
        pass
