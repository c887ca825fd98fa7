"""Cells: which cell a node belongs to, the topics a cell uses, and who summarises it. Pure.

A large mesh gossips full adverts only inside a cell (docs/gossip-at-scale.md). A node's cell
follows from what it cannot choose:

* ``label``: the value of one label of its CA certificate (``[gossip] cell_label``, by default
  ``region``), so an operator puts nodes in cells by issuing their certificates;
* ``hash``: rendezvous hashing of its peer id over ``ceil(mesh_size / cell_size)`` cells, so a
  change in the number of cells moves few nodes (growing from n to n + 1 cells moves about
  1 / (n + 1) of them);
* ``off``: no cells; every advert goes on the one mesh-wide topic (``ADVERT_TOPIC``).

Every node computes every other node's cell from its certified labels or its peer id: an advert
or a summary that claims another cell than its author's is refused.

The summariser of a cell for a period is the member with the lowest hash of (period, peer id)
among the members a node knows alive: the duty rotates every period, and a member that died is
out of everyone's list within an advert expiry, so another one takes over.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Iterable, Mapping

from meshd.core.messages import ADVERT_TOPIC

OFF = "off"
LABEL = "label"
HASH = "hash"
MODES = (OFF, LABEL, HASH)

CELL_ADVERT_TOPIC = ADVERT_TOPIC + "/{cell}"  # full adverts among a cell's members
SUMMARY_TOPIC = "meshd/summaries/1"  # every cell's summary, mesh-wide
MAX_CELL_CHARS = 64
NO_LABEL = "none"  # the cell of a node whose certificate lacks the label
_UNSAFE = re.compile(r"[^A-Za-z0-9_.:-]")


def cell_count(mesh_size: int, cell_size: int) -> int:
    """How many cells hash mode makes of a mesh of ``mesh_size`` nodes (at least one)."""
    if mesh_size <= 0 or cell_size <= 0:
        return 1
    return max(1, math.ceil(mesh_size / cell_size))


def _h(*parts: str) -> int:
    return int.from_bytes(hashlib.sha256("\0".join(parts).encode()).digest()[:8], "big")


def hash_cell(peer_id: str, count: int) -> str:
    """Rendezvous hashing: the cell ``i`` (of ``count``) whose hash with the peer id is highest."""
    count = max(1, count)
    best = max(range(count), key=lambda i: (_h("cell", str(i), peer_id), -i))
    return f"h{best}"


def label_cell(labels: Mapping[str, str], key: str) -> str:
    """The cell a label names: its value, with characters a topic should not hold replaced."""
    value = str(labels.get(key, "") or NO_LABEL)
    return _UNSAFE.sub("_", value)[:MAX_CELL_CHARS]


def cell_of(mode: str, peer_id: str, labels: Mapping[str, str], *, label_key: str = "region",
            count: int = 1) -> str | None:
    """The cell of a node (None when cells are off)."""
    if mode == LABEL:
        return label_cell(labels, label_key)
    if mode == HASH:
        return hash_cell(peer_id, count)
    return None


def advert_topic(cell: str | None) -> str:
    """Where a node of ``cell`` publishes its advert (the flat topic when cells are off)."""
    return ADVERT_TOPIC if cell is None else CELL_ADVERT_TOPIC.format(cell=cell)


def summary_period(wall_now: float, interval_s: float) -> int:
    """The summary period that the wall-clock time ``wall_now`` falls in."""
    return int(wall_now // interval_s)


def summariser(members: Iterable[str], period: int) -> str | None:
    """The member that publishes the cell's summary for ``period`` (None: no member)."""
    best: tuple[int, str] | None = None
    for pid in members:
        k = (_h("summary", str(period), pid), pid)
        if best is None or k < best:
            best = k
    return None if best is None else best[1]
