"""The peer table: what this node believes about every attested peer. Pure; time is passed in.

Entries come from verified adverts. An advert whose sequence number is not above the last one
seen from its author is a replay and is dropped; so is one whose timestamp is far from our wall
clock (a recorded advert replayed after we forgot the author). Peers expire when their adverts
stop, and are dropped at once when their connection is lost or they stall; a later advert brings
them back.

``version`` counts the changes to the table (an advert taken, a peer dropped, expired or stalled,
an RTT recorded, a request noted as sent): callers may keep what they derive from the table
while it is unchanged. ``PeerEntry.memo`` is such a keeping place for one entry (the daemon's
snapshot builder, ``meshd.node.view``, keeps there what it derives from the entry's advert).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from meshd.core.advert import Advert

DEFAULT_MAX_SKEW_S = 120.0
MAX_REMEMBERED_SEQS = 100_000


class Verdict(enum.Enum):
    NEW = "new"  # a peer we did not have
    UPDATED = "updated"
    REPLAY = "replay"  # seq not above the last one seen
    STALE = "stale"  # timestamp too far from our clock
    SELF = "self"  # our own advert echoed back


@dataclass(slots=True)
class PeerEntry:
    advert: Advert
    heard_at: float  # monotonic seconds when the advert arrived
    rtt_ms: float | None = None  # last measured RTT
    rtt_at: float = 0.0
    sent_since_advert: int = 0
    stalled: bool = False
    # Derived from ``advert`` by a caller, which checks that it is still about this advert.
    memo: Any = field(default=None, compare=False, repr=False)


@dataclass(slots=True)
class PeerTable:
    local_peer_id: str
    expiry_s: float
    max_skew_s: float = DEFAULT_MAX_SKEW_S
    entries: dict[str, PeerEntry] = field(default_factory=dict)
    last_seq: dict[str, int] = field(default_factory=dict)
    version: int = field(default=0, compare=False)  # bumped on every change to an entry
    _live: tuple[int, list[PeerEntry]] = field(
        default_factory=lambda: (-1, []), init=False, compare=False, repr=False
    )

    def apply(self, advert: Advert, now: float, wall_now: float) -> Verdict:
        """Take a verified advert; returns what it did to the table."""
        if advert.peer_id == self.local_peer_id:
            return Verdict.SELF
        if advert.seq <= self.last_seq.get(advert.peer_id, -1):
            return Verdict.REPLAY
        if abs(advert.ts - wall_now) > self.max_skew_s:
            return Verdict.STALE
        if len(self.last_seq) >= MAX_REMEMBERED_SEQS and advert.peer_id not in self.last_seq:
            self._forget_oldest_seq()
        self.last_seq[advert.peer_id] = advert.seq
        self.version += 1
        entry = self.entries.get(advert.peer_id)
        if entry is None:
            self.entries[advert.peer_id] = PeerEntry(advert=advert, heard_at=now)
            return Verdict.NEW
        entry.advert = advert
        entry.heard_at = now
        entry.sent_since_advert = 0
        entry.stalled = False
        return Verdict.UPDATED

    def _forget_oldest_seq(self) -> None:
        for pid in list(self.last_seq):
            if pid not in self.entries:
                del self.last_seq[pid]
                return

    def expire(self, now: float) -> list[str]:
        """Remove peers whose last advert is older than ``expiry_s``; returns their ids."""
        gone = [pid for pid, e in self.entries.items() if now - e.heard_at > self.expiry_s]
        for pid in gone:
            del self.entries[pid]
        if gone:
            self.version += 1
        return sorted(gone)

    def drop(self, peer_id: str) -> bool:
        """The connection to ``peer_id`` was lost or it stalled: stop routing to it."""
        if self.entries.pop(peer_id, None) is None:
            return False
        self.version += 1
        return True

    def mark_stalled(self, peer_id: str) -> None:
        e = self.entries.get(peer_id)
        if e is not None:
            e.stalled = True
            self.version += 1

    def record_rtt(self, peer_id: str, rtt_ms: float, now: float) -> None:
        e = self.entries.get(peer_id)
        if e is not None:
            e.rtt_ms = rtt_ms
            e.rtt_at = now
            self.version += 1

    def note_sent(self, peer_id: str) -> None:
        e = self.entries.get(peer_id)
        if e is not None:
            e.sent_since_advert += 1
            self.version += 1

    def get(self, peer_id: str) -> PeerEntry | None:
        return self.entries.get(peer_id)

    def live(self) -> list[PeerEntry]:
        """Entries that may be routed to, sorted by peer id (kept while ``version`` is unchanged;
        each call returns a new list)."""
        version, live = self._live
        if version != self.version:
            live = [e for _, e in sorted(self.entries.items()) if not e.stalled]
            self._live = (self.version, live)
        return list(live)

    def known(self) -> list[PeerEntry]:
        """Every entry, stalled ones included, sorted by peer id."""
        return [e for _, e in sorted(self.entries.items())]

    def __len__(self) -> int:
        return len(self.entries)
