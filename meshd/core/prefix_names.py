"""Names of prompt prefixes: what an engine's KV prefix cache stores blocks under, what a node
advertises of it, and how much of a request's prompt a node holds. Pure: no I/O.

A prompt is cut into blocks of ``BLOCK_TOKENS`` tokens; block ``i`` is named by a 16-byte
BLAKE2b hash chained over the model's identity (``meshd.core.modelid``) and every token of
blocks ``0..i`` (``block_hashes``), so equal names mean equal prefixes of one model. The engine
stores blocks under these names (``meshd.core.prefix_cache``); the entry node, which
tokenizes at the edge, computes the same names for a request once.

A node's advert carries a bounded sketch of the prefixes it holds (``sketch``): a Bloom filter
of the names of every block it holds at a depth of a whole prefill chunk (4, 8, 12, ... blocks:
128, 256, 384, ... tokens, what the engine reuses), most recently used first, at most
``SKETCH_MAX_NAMES`` (256) of them, ``SKETCH_BITS_PER_NAME`` (16) bits per name rounded up to
a power of two: 8 to ``SKETCH_MAX_BYTES`` (512) bytes, at most 519 bytes of msgpack per model
with its key. Each name sets ``SKETCH_HASHES`` (6) bits, taken from the name itself (already a
hash): a name not held tests as held with probability at most (1 - e^(-6/16))^6 < 0.1%. A
request's ``matched_tokens`` at a node is its longest run of chunk-depth names from the first
that the sketch holds: never more than the node can reuse but for that rate (a prefix is
stored from its first block, and the shallowest names of a chain are its most recently used),
to the chunk.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Sequence

BLOCK_TOKENS = 32
HASH_BYTES = 16
CHUNK_BLOCKS = 4  # sketch depths: every 4 blocks, 128 tokens (the engine's prefill chunk)
SKETCH_MAX_BYTES = 512
SKETCH_BITS_PER_NAME = 16
SKETCH_MAX_NAMES = SKETCH_MAX_BYTES * 8 // SKETCH_BITS_PER_NAME  # 256
SKETCH_MIN_BYTES = 8
SKETCH_HASHES = 6
_POSITION_BITS = 12  # each of the 6 positions: 12 bits of the name (4,096 bits at most)
_NAME_BYTES_USED = SKETCH_HASHES * _POSITION_BITS // 8  # 9


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


def sketch_span(tokens: int, block: int = BLOCK_TOKENS) -> int:
    """The prompt tokens whose names a sketch lookup needs: the whole chunks before the
    prompt's last token (the engine never reuses that one); 0 when there is none."""
    chunk = CHUNK_BLOCKS * block
    return max(tokens - 1, 0) // chunk * chunk


def sketch_depth(depth: int) -> bool:
    """Whether a block at ``depth`` (1 = the first block) is one a sketch holds: 4, 8, 12, ..."""
    return depth > 0 and depth % CHUNK_BLOCKS == 0


def sketch_bytes(names: int) -> int:
    """Bytes of a sketch of ``names`` names: 16 bits a name rounded up to a power of two, from
    8 to 512 (0 for none)."""
    if names <= 0:
        return 0
    size = SKETCH_MIN_BYTES
    while size * 8 < names * SKETCH_BITS_PER_NAME and size < SKETCH_MAX_BYTES:
        size *= 2
    return size


def valid_sketch(sketch: bytes) -> bool:
    """Whether ``sketch`` has a sketch's length: empty, or a power of two from 8 to 512."""
    n = len(sketch)
    return n == 0 or (SKETCH_MIN_BYTES <= n <= SKETCH_MAX_BYTES and n & (n - 1) == 0)


def _mask(name: bytes, bits: int) -> int:
    """The sketch bits ``name`` sets in a sketch of ``bits`` bits (a power of two)."""
    v = int.from_bytes(name[:_NAME_BYTES_USED], "little")
    m = 0
    for i in range(SKETCH_HASHES):
        m |= 1 << ((v >> (i * _POSITION_BITS)) & (bits - 1))
    return m


def sketch(names_by_recency: Iterable[tuple[bytes, int]],
           limit: int = SKETCH_MAX_NAMES) -> bytes:
    """A node's advertised sketch: from its stored ``(name, depth)`` pairs, most recently used
    first, the names at chunk depths, at most ``limit`` of them, in a Bloom filter of
    ``sketch_bytes`` bytes (little-endian bit order; empty when it holds none)."""
    picked: dict[bytes, None] = {}
    for name, depth in names_by_recency:
        if sketch_depth(depth) and name not in picked:
            picked[name] = None
            if len(picked) >= limit:
                break
    size = sketch_bytes(len(picked))
    v = 0
    for name in picked:
        v |= _mask(name, size * 8)
    return v.to_bytes(size, "little")


def sketch_probes(names: Sequence[bytes]) -> list[bytes]:
    """A request's names a sketch may hold, shallowest first: those at depths 4, 8, 12, ..."""
    return list(names[CHUNK_BLOCKS - 1::CHUNK_BLOCKS])


def probe_masks(probes: Sequence[bytes], bits: int) -> list[int]:
    """Each probe's bits in a sketch of ``bits`` bits (computed once per sketch size)."""
    return [_mask(p, bits) for p in probes]


def held_chunks(value: int, masks: Sequence[int]) -> int:
    """How many of the probes (as ``probe_masks``) from the first a sketch read as the integer
    ``value`` holds, up to the first it does not."""
    n = 0
    for m in masks:
        if value & m != m:
            break
        n += 1
    return n


def matched_tokens(names: Sequence[bytes], advertised: bytes,
                   block: int = BLOCK_TOKENS) -> int:
    """Tokens of a request's prompt (its block ``names``) that a node advertising the sketch
    ``advertised`` holds: its longest run of chunk-depth names from the first (0: none)."""
    if not advertised:
        return 0
    masks = probe_masks(sketch_probes(names), len(advertised) * 8)
    return held_chunks(int.from_bytes(advertised, "little"), masks) * CHUNK_BLOCKS * block
