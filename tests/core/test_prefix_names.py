"""Prefix names: chained block hashes, the advertised sketch and the matched length (pure)."""

from __future__ import annotations

import random

import pytest

from meshd.core.prefix_cache import PrefixCache
from meshd.core.prefix_names import (
    BLOCK_TOKENS,
    SKETCH_MAX_BYTES,
    SKETCH_MAX_NAMES,
    block_hashes,
    matched_tokens,
    sketch,
    sketch_bytes,
    sketch_depth,
    sketch_span,
    valid_sketch,
)


def test_names_chain_over_the_model_and_every_earlier_token() -> None:
    ids = list(range(7, 7 + 3 * BLOCK_TOKENS + 1))
    names = block_hashes(ids, "gguf:aa")
    assert len(names) == 3 and len(set(names)) == 3
    assert block_hashes(ids[:BLOCK_TOKENS], "gguf:aa") == names[:1]
    assert block_hashes(ids, "gguf:bb")[0] != names[0]  # another model: other names


@pytest.mark.parametrize(("depth", "held"), [
    (0, False), (1, False), (3, False), (4, True), (6, False), (8, True), (12, True),
    (20, True), (48, True), (50, False)])
def test_sketch_depths_are_every_128_token_chunk(depth: int, held: bool) -> None:
    assert sketch_depth(depth) is held


@pytest.mark.parametrize(("names", "size"), [(0, 0), (1, 8), (4, 8), (5, 16), (100, 256),
                                             (129, 512), (256, 512), (10_000, 512)])
def test_a_sketch_takes_16_bits_a_name_in_a_power_of_two_bytes_at_most_512(names: int,
                                                                           size: int) -> None:
    assert sketch_bytes(names) == size
    assert size == 0 or valid_sketch(bytes(size))


@pytest.mark.parametrize(("size", "ok"), [(0, True), (8, True), (64, True), (512, True),
                                          (4, False), (24, False), (1024, False)])
def test_only_sketch_lengths_are_valid(size: int, ok: bool) -> None:
    assert valid_sketch(bytes(size)) is ok


def chain(start: int, blocks: int) -> list[bytes]:
    return block_hashes(list(range(start, start + blocks * BLOCK_TOKENS)), "meshd:x")


def held(names: list[bytes]) -> list[tuple[bytes, int]]:
    return [(n, d) for d, n in enumerate(names, 1)]


@pytest.mark.parametrize(("request_blocks", "held_blocks", "want_tokens"), [
    (10, 0, 0),  # the node holds nothing
    (10, 4, 128),  # a 128-token prefix
    (10, 8, 256),
    (10, 7, 128),  # whole chunks only
    (3, 4, 0),  # the prompt is shorter than a chunk
    (20, 20, 640),  # to the chunk: the summary of 16 names at 4, 8, 16, ... blocks said 512
    (40, 40, 1280),  # ... and 1,024
    (40, 24, 768),
])
def test_matched_tokens_is_the_longest_run_of_held_chunks(request_blocks: int, held_blocks: int,
                                                          want_tokens: int) -> None:
    node = chain(0, 64)[:held_blocks]  # what the node holds: a prefix of the request's prompt
    advertised = sketch(held(node))
    names = chain(0, request_blocks)
    assert matched_tokens(names, advertised) == want_tokens
    assert matched_tokens(chain(1, request_blocks), advertised) == 0  # another prompt
    assert matched_tokens(block_hashes(list(range(request_blocks * BLOCK_TOKENS)), "meshd:y"),
                          advertised) == 0  # another model's names


def test_a_held_history_stays_findable_after_the_node_served_many_other_prompts() -> None:
    """The summary of the 16 most recent names (3 of each such prompt) lost a conversation
    after 6 other prompts; the sketch holds the 256 most recent chunk names (64 of them)."""
    cache = PrefixCache(1 << 30)
    history = chain(0, 24)  # the conversation's prompt: 768 tokens
    cache.store("s", history, {i: (None, 1) for i in range(len(history))})
    for k in range(60):  # then 60 other prompts of 4 chunks each
        other = chain(10_000 * (k + 1), 16)
        cache.store("s", other, {i: (None, 1) for i in range(len(other))})
    got = cache.sketch("s")
    assert len(got) == SKETCH_MAX_BYTES
    assert matched_tokens(chain(0, 30), got) == 768


def test_the_sketch_is_bounded_to_the_most_recently_used_and_rarely_wrong() -> None:
    recent = [(n, 4) for k in range(SKETCH_MAX_NAMES) for n in chain(7_000_000 + k * 1000, 4)[3:]]
    old = [(n, 4) for k in range(200) for n in chain(9_000_000 + k * 1000, 4)[3:]]
    got = sketch(recent + old + recent[:3])  # most recent first; a repeat counts once
    assert len(got) == SKETCH_MAX_BYTES
    assert all(matched_tokens([b"", b"", b"", n], got) == 128 for n, _ in recent)
    # names left out (or never held) read as held at most at the stated rate: (1-e^-3/8)^6
    rng = random.Random(5)
    strangers = [rng.randbytes(16) for _ in range(20_000)]
    wrong = sum(matched_tokens([b"", b"", b"", n], got) > 0 for n in strangers)
    assert wrong / len(strangers) < 0.002
    assert sum(matched_tokens([b"", b"", b"", n], got) > 0 for n, _ in old) < 5
    assert sketch([]) == b"" and sketch([(b"a" * 16, 3)]) == b""  # no chunk depth: nothing


@pytest.mark.parametrize(("tokens", "span"), [(0, 0), (128, 0), (129, 128), (256, 128),
                                              (257, 256), (647, 640), (5000, 4992)])
def test_the_names_a_lookup_needs_are_the_whole_chunks_before_the_last_token(tokens: int,
                                                                             span: int) -> None:
    assert sketch_span(tokens) == span
