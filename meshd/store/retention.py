"""Keep the store bounded by age and size: ``prune`` (synchronous, on a ``Store``) and
``run_pruner`` (the daemon's timer, on an ``AsyncStore``).

Each prune deletes, from every table (journal, decisions, outcomes, audit), the rows older than
the age bound; then, while the data fills more than ``FILL`` of the size bound, the oldest tenth
of the rows that are left. The size counted is the database's pages in use (SQLite reuses freed
pages, so the file stops growing once it has reached about what the data needs between two
prunes), and the write-ahead log is checkpointed and truncated at the end. Between prunes the
data grows by what the node records in one interval: at the defaults (a quarter of 256 MiB per
5 minutes) far more than a node writes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import trio

from meshd.store.store import Store

log = logging.getLogger(__name__)

TABLES = ("journal", "decisions", "outcomes", "audit")
FILL = 0.75  # after a prune the data fills at most this share of the size bound
MAX_ROUNDS = 40  # each round deletes a tenth of what is left: 0.9^40 leaves under 1.5%


@dataclass(frozen=True)
class Retention:
    max_age_s: float
    max_bytes: int
    interval_s: float

    @classmethod
    def from_config(cls, store_cfg: Any) -> Retention:
        return cls(max_age_s=store_cfg.max_age_days * 86400.0,
                   max_bytes=int(store_cfg.max_size_mb * 1024 * 1024),
                   interval_s=store_cfg.prune_interval_s)


@dataclass(frozen=True)
class PruneResult:
    deleted_old: int  # rows past the age bound
    deleted_for_size: int  # rows deleted to get under the size bound
    used_bytes: int  # pages in use afterwards


def used_bytes(store: Store) -> int:
    """Bytes of the database's pages that hold data (free pages not counted)."""
    with store._lock:
        pages = store.db.execute("PRAGMA page_count").fetchone()[0]
        free = store.db.execute("PRAGMA freelist_count").fetchone()[0]
        size = store.db.execute("PRAGMA page_size").fetchone()[0]
    return int((pages - free) * size)


def _rows(store: Store) -> int:
    return sum(store.db.execute(f"SELECT COUNT(*) FROM [{t}]").fetchone()[0] for t in TABLES)


def _cutoff(store: Store, skip: int) -> float | None:
    """The ts below which about ``skip`` rows (the oldest, over every table) lie."""
    union = " UNION ALL ".join(f"SELECT ts FROM [{t}]" for t in TABLES)
    row = store.db.execute(f"SELECT ts FROM ({union}) ORDER BY ts LIMIT 1 OFFSET ?",
                           [skip]).fetchone()
    return None if row is None else float(row[0])


def prune(store: Store, retention: Retention, now: float) -> PruneResult:
    """One prune of ``store`` at wall time ``now`` (see the module docstring)."""
    old = store.prune(now - retention.max_age_s)
    target = int(retention.max_bytes * FILL)
    for_size = 0
    with store._lock:
        for _ in range(MAX_ROUNDS):
            if used_bytes(store) <= target:
                break
            left = _rows(store)
            if left == 0:
                break
            cutoff = _cutoff(store, max(1, left // 10))
            # rows at exactly the cutoff go too, so every round makes progress
            for_size += store.prune(float("inf") if cutoff is None else cutoff + 1e-9)
        store.db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    return PruneResult(old, for_size, used_bytes(store))


class Prunable(Protocol):
    """What ``run_pruner`` needs of the store (``AsyncStore``)."""

    async def prune_to(self, retention: Retention, now: float) -> PruneResult: ...


async def run_pruner(store: Prunable, retention: Retention, *,
                     wall_clock: Callable[[], float] = time.time,
                     task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    """Prune ``store`` (an ``AsyncStore``) at start and then every ``retention.interval_s``."""
    task_status.started()
    while True:
        try:
            result: PruneResult = await store.prune_to(retention, wall_clock())
        except Exception as err:  # a full disk must not stop the node; try again next time
            log.warning("store prune failed error=%r", err)
        else:
            level = logging.INFO if result.deleted_old or result.deleted_for_size else logging.DEBUG
            log.log(level, "store pruned old=%d for_size=%d used_bytes=%d", result.deleted_old,
                    result.deleted_for_size, result.used_bytes)
        await trio.sleep(retention.interval_s)
