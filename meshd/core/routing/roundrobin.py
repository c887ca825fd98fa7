"""The round-robin strategies: each entry node walks its own order of the candidates.

``round_robin`` starts each node's counter at ``round_robin_offset`` (a number fixed by its
identity) and walks its own permutation (``round_robin_rank``), so independent balancers do
not point at the same servers; ``round_robin_lockstep`` (counters from 0, peer id order) is
kept only to show the herd that avoids. ``random`` starts at a random place instead.
"""

from __future__ import annotations

import hashlib

import numpy as np

from meshd.core.routing.index import ModelIndex, Positions

LOCKSTEP = "round_robin_lockstep"


def round_robin_offset(peer_id: str, strategy: str = "round_robin") -> int:
    """Where a node's round-robin counter starts: a number fixed by its identity.

    Independent balancers do not start in step. If every node's counter started at 0 and every
    node walked the same list, all entry nodes would point at the same few servers at any
    moment (``round_robin_lockstep``, kept to show that herd: its counters start at 0). The
    daemon starts its counter here; the simulator draws each node's offset from its seeded
    generator instead (so that a seed changes it). Stable across restarts and platforms.
    """
    if strategy == LOCKSTEP:
        return 0
    digest = hashlib.blake2b(b"rr-offset\0" + peer_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 33  # 31 bits


def round_robin_rank(local_peer_id: str, peer_id: str) -> int:
    """``peer_id``'s place in ``local_peer_id``'s own order of peers (lower first).

    Each node walks its own permutation of the candidates, a stable hash of the pair, so two
    entry nodes whose counters happen to agree still point at different servers.
    """
    key = f"{local_peer_id}\0{peer_id}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big")


def rr_order(idx: ModelIndex, local_peer_id: str) -> list[int]:
    """The positions of every node of ``idx`` in ``local_peer_id``'s own round-robin order
    (memoised in the index: a snapshot is one node's)."""
    hit = idx.rr
    if hit is None or hit[0] != local_peer_id:
        keys = [round_robin_rank(local_peer_id, pid) for pid in idx.ids]
        hit = idx.rr = (local_peer_id, sorted(range(len(keys)), key=keys.__getitem__))
    return hit[1]


def _round_robin(idx: ModelIndex, e: Positions, local_peer_id: str, rr_index: int,
                 k: int) -> list[int]:  # fmt: skip
    """The first ``k`` positions (in ``e``) of the local node's own order, from ``rr_index``."""
    order = rr_order(idx, local_peer_id)
    n = len(e)
    if n == len(order):
        seq = order  # every node is eligible: positions in e are positions in the index
    elif isinstance(e, np.ndarray):
        at = np.full(len(order), -1, dtype=np.intp)
        at[e] = np.arange(n, dtype=np.intp)
        seq = [p for p in at[order].tolist() if p >= 0]
    else:
        where = dict(zip(e, range(n), strict=True))
        seq = [where[i] for i in order if i in where]
    start = rr_index % n
    return [seq[(start + j) % n] for j in range(min(k, n))]
