"""Prefix names: chained block hashes, the advertised summary and the matched length (pure)."""

from __future__ import annotations

import pytest

from meshd.core.prefix_names import (
    BLOCK_TOKENS,
    SUMMARY_NAME_BYTES,
    SUMMARY_NAMES,
    block_hashes,
    matched_tokens,
    summary,
    summary_depth,
    summary_span,
)


def test_names_chain_over_the_model_and_every_earlier_token() -> None:
    ids = list(range(7, 7 + 3 * BLOCK_TOKENS + 1))
    names = block_hashes(ids, "gguf:aa")
    assert len(names) == 3 and len(set(names)) == 3
    assert block_hashes(ids[:BLOCK_TOKENS], "gguf:aa") == names[:1]
    assert block_hashes(ids, "gguf:bb")[0] != names[0]  # another model: other names


@pytest.mark.parametrize(("depth", "listed"), [
    (1, False), (3, False), (4, True), (6, False), (8, True), (12, False), (16, True),
    (32, True), (48, False), (64, True), (1024, True)])
def test_summary_depths_are_128_256_512_tokens_and_so_on(depth: int, listed: bool) -> None:
    assert summary_depth(depth) is listed


def test_summary_is_bounded_most_recent_first_without_repeats() -> None:
    held = [(bytes([d]) * 16, d) for d in range(1, 70)]  # one chain of 69 blocks
    assert summary(held) == tuple(bytes([d]) * SUMMARY_NAME_BYTES for d in (4, 8, 16, 32, 64))
    many = [(i.to_bytes(2, "big") * 8, 4) for i in range(100)]
    got = summary(many)
    assert len(got) == SUMMARY_NAMES and got[0] == many[0][0][:SUMMARY_NAME_BYTES]
    assert summary([(b"a" * 16, 4), (b"a" * 16, 4)]) == (b"a" * 8,)


@pytest.mark.parametrize(("request_blocks", "held_depths", "want_tokens"), [
    (10, [], 0),  # the node holds nothing
    (10, [4], 128),  # a 128-token prefix
    (10, [4, 8], 256),  # the deepest listed
    (3, [4], 0),  # the prompt is shorter than the shortest listed prefix
    (20, [16], 512),
    (40, [4, 8, 16, 32], 1024),  # credited at 32 blocks though 40 may be held: at least half
])
def test_matched_tokens_is_the_deepest_listed_prefix(request_blocks: int, held_depths: list[int],
                                                      want_tokens: int) -> None:
    held = block_hashes(list(range(64 * BLOCK_TOKENS)), "meshd:x")  # what the node holds
    advertised = [held[d - 1][:SUMMARY_NAME_BYTES] for d in held_depths]
    ids = list(range(request_blocks * BLOCK_TOKENS + 5))  # the request: a prefix of it
    names = block_hashes(ids, "meshd:x")
    assert matched_tokens(names, advertised) == want_tokens
    other = block_hashes([i + 1 for i in ids], "meshd:x")  # another prompt: no match
    assert matched_tokens(other, advertised) == 0


@pytest.mark.parametrize(("tokens", "span"), [(0, 0), (127, 0), (128, 128), (255, 128),
                                              (256, 256), (647, 512), (5000, 4096)])
def test_the_names_a_lookup_needs_end_at_the_deepest_summary_depth(tokens: int, span: int) -> None:
    assert summary_span(tokens) == span
