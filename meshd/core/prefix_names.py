"""Names of prompt prefixes: what an engine's KV prefix cache stores blocks under, what a node
advertises of it, and how much of a request's prompt a node holds. Pure: no I/O.

A prompt is cut into blocks of ``BLOCK_TOKENS`` tokens; block ``i`` is named by a 16-byte
BLAKE2b hash chained over the model's identity (``meshd.core.modelid``) and every token of
blocks ``0..i`` (``block_hashes``), so equal names mean equal prefixes of one model. The engine
stores blocks under these names (``meshd.core.prefix_cache``); the entry node, which
tokenizes at the edge, computes the same names for a request once.

A node's advert carries a bounded summary of the prefixes it holds (``summary``): the first
``SUMMARY_NAME_BYTES`` bytes of the names of blocks at depths 4, 8, 16, 32, ... blocks (128,
256, 512, ... tokens: whole prefill chunks, which is what the engine reuses), most recently
used first, at most ``SUMMARY_NAMES`` of them: at most 166 bytes of msgpack per model. A
request's ``matched_tokens`` at a node is the deepest of its own names that the summary holds:
never more than the node can reuse (a prefix it holds is advertised at a depth at or below
its length), at least half of it when the summary lists that chain.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Sequence

BLOCK_TOKENS = 32
HASH_BYTES = 16
SUMMARY_NAMES = 16
SUMMARY_NAME_BYTES = 8
FIRST_SUMMARY_DEPTH = 4  # blocks: 128 tokens, the engine's prefill chunk


def block_hashes(ids: Sequence[int], identity: str, block: int = BLOCK_TOKENS) -> list[bytes]:
    """The chained name of each full block of ``ids`` for the model ``identity``: name ``i`` =
    H(name ``i-1`` + block ``i``'s tokens as little-endian uint32), name ``-1`` = H(identity)."""
    blake, pack = hashlib.blake2b, struct.Struct(f"<{block}I").pack
    h = blake(identity.encode(), digest_size=HASH_BYTES).digest()
    out: list[bytes] = []
    for i in range(0, len(ids) // block * block, block):
        h = blake(h + pack(*ids[i:i + block]), digest_size=HASH_BYTES).digest()
        out.append(h)
    return out


def summary_span(tokens: int, block: int = BLOCK_TOKENS) -> int:
    """The prompt tokens whose names a summary lookup needs: up to the deepest summary depth
    the prompt reaches (4, 8, 16, ... blocks); 0 when it reaches none."""
    depth = FIRST_SUMMARY_DEPTH
    if tokens < depth * block:
        return 0
    while depth * 2 * block <= tokens:
        depth *= 2
    return depth * block


def summary_depth(depth: int) -> bool:
    """Whether a block at ``depth`` (1 = the first block) is one a summary may list: 4, 8, 16,
    32, ... blocks."""
    return depth >= FIRST_SUMMARY_DEPTH and depth % FIRST_SUMMARY_DEPTH == 0 and \
        (depth // FIRST_SUMMARY_DEPTH) & (depth // FIRST_SUMMARY_DEPTH - 1) == 0


def summary(names_by_recency: Iterable[tuple[bytes, int]],
            limit: int = SUMMARY_NAMES) -> tuple[bytes, ...]:
    """A node's advertised summary: from its stored ``(name, depth)`` pairs, most recently used
    first, the short names of those at summary depths, at most ``limit``, without repeats."""
    out: list[bytes] = []
    for name, depth in names_by_recency:
        if summary_depth(depth):
            short = name[:SUMMARY_NAME_BYTES]
            if short not in out:
                out.append(short)
                if len(out) >= limit:
                    break
    return tuple(out)


def summary_probes(names: Sequence[bytes], block: int = BLOCK_TOKENS) -> list[tuple[int, bytes]]:
    """A request's prefixes as a summary may list them: (tokens, short name) at depths 4, 8,
    16, ... blocks of its ``names``, shallowest first."""
    out: list[tuple[int, bytes]] = []
    depth = FIRST_SUMMARY_DEPTH
    while depth <= len(names):
        out.append((depth * block, names[depth - 1][:SUMMARY_NAME_BYTES]))
        depth *= 2
    return out


def matched_tokens(names: Sequence[bytes], advertised: Iterable[bytes],
                   block: int = BLOCK_TOKENS) -> int:
    """Tokens of a request's prompt (its block ``names``) that a node advertising ``advertised``
    holds: the deepest summary depth whose name it lists (0: none)."""
    held = set(advertised)
    return max((t for t, short in summary_probes(names, block) if short in held), default=0)
