"""The summaries a node holds: the latest of each cell, and when each goes. Pure; time comes in.

A cell is forgotten when no summary of it has been published for ``ttl_s`` (the node's
``summary_interval_s`` times ``summary_expiry_intervals``): a cell that lost all its nodes has
nobody left to publish, so it disappears from every node's table at most ``ttl_s`` after its
last summary was published (plus gossip delay). The age of a summary is counted from its
publication time (wall clock), so one handed over late (in a SYNC) does not live longer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from meshd.core.summary import CellSummary


@dataclass(slots=True)
class HeldSummary:
    summary: CellSummary
    data: bytes  # the signed envelope, as gossiped (handed to a new link)
    published_at: float  # monotonic time at which it was published, by the local clock


@dataclass(slots=True)
class SummaryTable:
    ttl_s: float
    cells: dict[str, HeldSummary] = field(default_factory=dict)

    def apply(self, s: CellSummary, data: bytes, now: float, wall_now: float) -> bool:
        """Take a checked summary; True if it is now the one held for its cell (newer period,
        or the same period seen by more members)."""
        published = now - max(0.0, wall_now - s.ts)
        if now - published > self.ttl_s:
            return False
        held = self.cells.get(s.cell)
        if held is not None:
            h = held.summary
            if (s.period, s.members, s.ts) <= (h.period, h.members, h.ts):
                return False
        self.cells[s.cell] = HeldSummary(s, bytes(data), published)
        return True

    def expire(self, now: float) -> list[str]:
        """Forget the cells whose latest summary is older than ``ttl_s``; returns them."""
        gone = sorted(c for c, h in self.cells.items() if now - h.published_at > self.ttl_s)
        for c in gone:
            del self.cells[c]
        return gone

    def get(self, cell: str) -> CellSummary | None:
        h = self.cells.get(cell)
        return None if h is None else h.summary

    def summaries(self) -> list[CellSummary]:
        return [h.summary for _, h in sorted(self.cells.items())]

    def signed(self) -> list[bytes]:
        return [h.data for _, h in sorted(self.cells.items())]

    def __len__(self) -> int:
        return len(self.cells)
