"""Peer table: replay protection, expiry, drop and stale-load bookkeeping."""

from __future__ import annotations

from meshd.core.advert import Advert
from meshd.core.peertable import PeerTable, Verdict


def adv(pid: str, seq: int, ts: float = 1000.0) -> Advert:
    return Advert(peer_id=pid, name=pid, seq=seq, ts=ts)


def test_verdicts() -> None:
    t = PeerTable("me", expiry_s=15)
    assert t.apply(adv("me", 1), 0, 1000) is Verdict.SELF
    assert t.apply(adv("a", 5), 0, 1000) is Verdict.NEW
    assert t.apply(adv("a", 5), 1, 1000) is Verdict.REPLAY
    assert t.apply(adv("a", 4), 1, 1000) is Verdict.REPLAY
    assert t.apply(adv("a", 6), 1, 1000) is Verdict.UPDATED
    assert t.apply(adv("b", 1, ts=0.0), 1, 1000) is Verdict.STALE
    assert len(t) == 1


def test_expiry_and_replay_after_forgetting() -> None:
    t = PeerTable("me", expiry_s=15)
    t.apply(adv("a", 5), 0, 1000)
    assert t.expire(15.0) == []
    assert t.expire(15.1) == ["a"]
    # a recorded old advert replayed after expiry does not resurrect the peer
    assert t.apply(adv("a", 5), 20, 1000) is Verdict.REPLAY
    assert t.apply(adv("a", 7), 20, 1000) is Verdict.NEW


def test_drop_stall_and_sent_counter() -> None:
    t = PeerTable("me", expiry_s=15)
    t.apply(adv("a", 1), 0, 1000)
    t.apply(adv("b", 1), 0, 1000)
    t.note_sent("a")
    t.note_sent("a")
    assert t.get("a").sent_since_advert == 2  # type: ignore[union-attr]
    t.apply(adv("a", 2), 1, 1000)
    assert t.get("a").sent_since_advert == 0  # type: ignore[union-attr]
    t.mark_stalled("b")
    assert [e.advert.peer_id for e in t.live()] == ["a"]
    assert t.drop("a") and not t.drop("a")
