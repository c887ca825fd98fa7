"""The store stays bounded by age and size (issue 13, defect 10): a simulated long run of a busy
node stays under ``max_size_mb``, old rows go after ``max_age_days``, and the daemon's pruner
runs on its timer and survives a failing prune."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from store_samples import CANDIDATES

from meshd.config import ConfigError, parse_config
from meshd.store import Store
from meshd.store.retention import FILL, PruneResult, Retention, prune, run_pruner, used_bytes

HOUR = 3600.0
DAY = 24 * HOUR
T0 = 1_700_000_000.0


def _busy_hour(store: Store, start: float, requests: int, seq: int) -> int:
    """One simulated hour of a busy entry node: per request 4 journal events, a decision, an
    outcome; plus a few refused handshakes."""
    rows = []
    from meshd.store import rows as r

    for i in range(requests):
        ts = start + i * HOUR / requests
        rid = f"r{seq + i:08d}"
        for kind in ("received", "routed", "first_token", "done"):
            rows.append(r.event_row(rid, kind, node="gw-1", payload={"tokens": 64}, ts=ts))
        rows.append(r.decision_row(rid, strategy="meshd", candidates=CANDIDATES * 2,
                                   constraints={"model": "tiny"}, chosen="gw-2",
                                   order=["gw-2", "gw-1"], ts=ts))
        rows.append(r.outcome_row(rid, ttft_ms=40.0, tokens=64, tokens_per_s=50.0,
                                  served_by="gw-2", route=["gw-2"], ts=ts))
    for j in range(5):
        rows.append(r.audit_row("attestation_failed", peer_id="12D3KooWOutsider", reason="wrong_ca",
                                detail={"address": "10.0.0.9:4001"}, ts=start + j))
    assert all(e is None for e in store.write(rows))
    return seq + requests


def _files(path: Path) -> tuple[int, int]:
    wal = Path(f"{path}-wal")
    return path.stat().st_size, wal.stat().st_size if wal.exists() else 0


def test_a_long_busy_run_stays_under_the_size_bound(tmp_path: Path) -> None:
    path = tmp_path / "meshd.db"
    store = Store(path)
    retention = Retention(max_age_s=30 * DAY, max_bytes=1024 * 1024, interval_s=HOUR)
    seq, written, sizes = 0, 0, []
    try:
        for hour in range(96):  # four days, one prune an hour
            now = T0 + hour * HOUR
            before = used_bytes(store)
            seq = _busy_hour(store, now, 60, seq)
            written += used_bytes(store) - before
            db, _ = _files(path)
            assert db <= retention.max_bytes, f"hour {hour}: {db} bytes before the prune"
            result = prune(store, retention, now + HOUR)
            db, wal = _files(path)
            sizes.append(db + wal)
            assert result.used_bytes <= FILL * retention.max_bytes
            assert db + wal <= retention.max_bytes, f"hour {hour}: {db} + {wal} bytes"
        assert written > 4 * retention.max_bytes  # the bound was really needed
        assert max(sizes[48:]) <= 1.05 * max(sizes[:48])  # no growth once full (a page or two)
        newest = store.recent_requests(1)[0]["request_id"]
        assert newest == f"r{seq - 1:08d}"  # the oldest rows went, the newest stayed
        assert store.explain("r00000000") is None
        assert store.audit_counts()["attestation_failed"] > 0
    finally:
        store.close()


def test_rows_older_than_the_age_bound_go(tmp_path: Path) -> None:
    store = Store(tmp_path / "meshd.db")
    retention = Retention(max_age_s=2 * DAY, max_bytes=64 * 1024 * 1024, interval_s=HOUR)
    try:
        seq = 0
        for day in range(5):
            seq = _busy_hour(store, T0 + day * DAY, 10, seq)
        result = prune(store, retention, T0 + 4 * DAY + HOUR)
        assert result.deleted_for_size == 0
        assert result.deleted_old == 3 * (10 * 6 + 5)  # days 0, 1 and 2
        left = store.recent_requests(100)
        assert len(left) == 20 and min(r["ts"] for r in left) >= T0 + 3 * DAY
        assert sum(store.audit_counts().values()) == 10
    finally:
        store.close()


class FakeStore:
    def __init__(self, fail_first: bool = False) -> None:
        self.calls: list[tuple[float, float]] = []
        self.fail_first = fail_first

    async def prune_to(self, retention: Retention, now: float) -> PruneResult:
        self.calls.append((trio.current_time(), now))
        if self.fail_first and len(self.calls) == 1:
            raise OSError(28, "No space left on device")
        return PruneResult(0, 0, 0)


@pytest.mark.parametrize("fail_first", [False, True])
def test_the_pruner_runs_on_its_timer(fail_first: bool) -> None:
    store = FakeStore(fail_first)
    retention = Retention(max_age_s=DAY, max_bytes=1 << 20, interval_s=300.0)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(lambda task_status: run_pruner(
                store, retention, wall_clock=lambda: T0 + trio.current_time(),
                task_status=task_status))
            await trio.sleep(3 * 300.0 + 1)
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert [round(t) for t, _ in store.calls] == [0, 300, 600, 900]
    assert [round(w - T0) for _, w in store.calls] == [0, 300, 600, 900]


def test_store_config_keys() -> None:
    cfg = parse_config({"store": {"max_age_days": 7, "max_size_mb": 64.5, "prune_interval_s": 60}})
    r = Retention.from_config(cfg.store)
    assert (r.max_age_s, r.max_bytes, r.interval_s) == (7 * DAY, int(64.5 * 1024 * 1024), 60.0)
    defaults = Retention.from_config(parse_config({}).store)
    assert (defaults.max_age_s, defaults.max_bytes) == (30 * DAY, 256 * 1024 * 1024)
    with pytest.raises(ConfigError, match=r"\[store\] max_size_mb must be > 0"):
        parse_config({"store": {"max_size_mb": 0}})
    with pytest.raises(ConfigError, match="unknown key 'max_rows'"):
        parse_config({"store": {"max_rows": 5}})


def test_async_store_prunes_through_its_writer(tmp_path: Path) -> None:
    from meshd.store import AsyncStore

    async def main() -> Any:
        store = AsyncStore(Store(tmp_path / "meshd.db"))
        async with trio.open_nursery() as nursery:
            await nursery.start(store.run)
            store.record_audit("revoked", peer_id="P", reason="old", ts=T0)
            store.record_audit("revoked", peer_id="P", reason="new", ts=T0 + 2 * DAY)
            result = await store.prune_to(Retention(DAY, 1 << 24, 60.0), T0 + 2 * DAY)
            left = await store.recent_audit(10)
            nursery.cancel_scope.cancel()
        store.close()
        return result, left

    result, left = trio.run(main)
    assert result.deleted_old == 1 and [e["reason"] for e in left] == ["new"]
    assert os.path.exists(tmp_path / "meshd.db")
