"""AsyncStore: the single writer task, reads after writes, and no write lost to cancellation."""

from __future__ import annotations

import sqlite3

import pytest
import trio
import trio.testing
from store_samples import decision, outcome

from meshd.store import AsyncStore, Recorder
from meshd.store.rows import Row


def journal_kinds(path):
    with sqlite3.connect(path) as conn:
        return [r[0] for r in conn.execute("SELECT kind FROM journal ORDER BY id")]


@pytest.fixture
def astore(store):
    return AsyncStore(store, max_batch=7)


def test_records_then_reads(astore):
    async def main():
        async with trio.open_nursery() as nursery:
            await nursery.start(astore.run)
            astore.record_event("r1", "received", node="gw-1", ts=1.0)
            astore.record_decision("r1", **decision(), ts=1.1)
            astore.record_outcome("r1", **outcome(), ts=1.2)
            astore.record_audit("revoked", peer_id="QmX", reason="serial 9", ts=1.3)
            record = await astore.explain("r1")  # flushes first: reads see earlier writes
            assert record["decision"]["chosen"] == "P2"
            assert record["outcome"]["served_by"] == "gw-2"
            assert await astore.audit_counts() == {"revoked": 1}
            assert [r["request_id"] for r in await astore.recent_requests(5)] == ["r1"]
            assert [a["peer_id"] for a in await astore.recent_audit()] == ["QmX"]
            stats = astore.statistics()
            assert stats.running and stats.written == 4 and stats.pending == 0
            nursery.cancel_scope.cancel()
        assert not astore.statistics().running

    trio.run(main)


def test_cancellation_loses_no_queued_write(astore):
    async def main():
        async with trio.open_nursery() as nursery:
            await nursery.start(astore.run)
            for i in range(500):
                astore.record_event(f"r{i}", "received", ts=float(i))
            assert astore.statistics().pending == 500
            nursery.cancel_scope.cancel()  # before the writer has written anything
        stats = astore.statistics()
        assert (stats.pending, stats.written, stats.failed) == (0, 500, 0)
        assert stats.batches == 72  # ceil(500 / 7)

    trio.run(main)
    assert len(journal_kinds(astore.store.path)) == 500


def test_cancelled_mid_batch_and_late_finally_writes(astore):
    async def request(task_status=trio.TASK_STATUS_IGNORED):
        try:
            astore.record_event("r", "received")
            task_status.started()
            await trio.sleep_forever()
        finally:
            astore.record_event("r", "cancelled", payload={"reason": "shutdown"})

    async def main():
        async with trio.open_nursery() as nursery:
            await nursery.start(astore.run)
            await nursery.start(request)
            for _ in range(20):
                astore.record_event("x", "received")
            await trio.testing.wait_all_tasks_blocked()  # the writer is inside a batch now
            nursery.cancel_scope.cancel()
        # after run returned: writes go straight to SQLite
        astore.record_event("r", "failed", payload={"error": "node stopping"})

    trio.run(main)
    kinds = journal_kinds(astore.store.path)
    assert kinds.count("received") == 21
    assert kinds[-2:] == ["cancelled", "failed"]
    assert astore.statistics().written == 23


def test_before_run_writes_synchronously(astore):
    astore.record_event("r", "received")
    assert journal_kinds(astore.store.path) == ["received"]

    async def main():
        assert (await astore.explain("r"))["events"][0]["kind"] == "received"

    trio.run(main)


def test_values_are_snapshotted_at_record_time(astore):
    payload = {"to": "P2"}

    async def main():
        async with trio.open_nursery() as nursery:
            await nursery.start(astore.run)
            astore.record_event("r", "routed", payload=payload)
            payload["to"] = "changed"
            assert (await astore.explain("r"))["events"][0]["payload"] == {"to": "P2"}
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_full_queue_drops_and_counts(store):
    astore = AsyncStore(store, max_pending=3)

    async def main():
        async with trio.open_nursery() as nursery:
            await nursery.start(astore.run)
            for i in range(10):  # no checkpoint: the writer cannot drain in between
                astore.record_event(f"r{i}", "received")
            await astore.flush()
            stats = astore.statistics()
            assert (stats.written, stats.dropped) == (3, 7)
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_a_failing_row_or_batch_does_not_stop_the_writer(astore, monkeypatch):
    async def main():
        async with trio.open_nursery() as nursery:
            await nursery.start(astore.run)
            astore._put(Row("journal", {"ts": None, "request_id": "r", "kind": "x"}))
            astore.record_event("r", "received")
            await astore.flush()
            assert (astore.statistics().failed, astore.statistics().written) == (1, 1)

            def broken(batch):
                raise sqlite3.OperationalError("disk I/O error")

            monkeypatch.setattr(astore.store, "write", broken)
            astore.record_event("r", "done")
            await astore.flush()
            assert astore.statistics().failed == 2
            monkeypatch.undo()
            astore.record_event("r", "done")
            await astore.flush()
            assert astore.statistics().written == 2
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_run_only_once(astore):
    async def main():
        async with trio.open_nursery() as nursery:
            await nursery.start(astore.run)
            with pytest.raises(RuntimeError):
                await astore.run()
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_both_stores_are_recorders(store, astore):
    recorders: list[Recorder] = [store, astore]
    for r in recorders:
        r.record_event("r", "received")
    assert len(journal_kinds(store.path)) == 2


def test_the_writer_lingers_and_writes_what_came_meanwhile_in_one_batch(store):
    """Rows are written together once the linger has passed, not one batch each as they come
    (a request's rows would each take a core from it while it runs); never before."""
    astore = AsyncStore(store, linger_s=0.3)

    async def main():
        async with trio.open_nursery() as nursery:
            await nursery.start(astore.run)
            t0 = trio.current_time()
            for i in range(3):
                astore.record_event(f"r{i}", "received")
                await trio.sleep(0.01)
            while astore.statistics().written < 3:
                assert trio.current_time() - t0 < 30, "the lingering writer never wrote"
                await trio.sleep(0.005)
            assert trio.current_time() - t0 >= 0.3  # not before the linger
            assert astore.statistics().batches == 1
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_a_full_batch_or_a_reader_does_not_wait_for_the_linger(store):
    astore = AsyncStore(store, max_batch=4, linger_s=3600)

    async def main():
        async with trio.open_nursery() as nursery:
            await nursery.start(astore.run)
            with trio.fail_after(30):
                for i in range(4):
                    astore.record_event(f"r{i}", "received")
                while astore.statistics().written < 4:  # a full batch goes at once
                    await trio.sleep(0.005)
                astore.record_event("r9", "received")
                record = await astore.explain("r9")  # a read flushes: no hour's wait
            assert record is not None and astore.statistics().pending == 0
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_a_row_after_a_batch_waits_its_own_linger(store):
    """Rows that came during a linger are written with its batch; the next row still gets a
    whole linger of its own (the wake those rows left is not taken for a new one)."""
    astore = AsyncStore(store, linger_s=0.3)

    async def main():
        async with trio.open_nursery() as nursery:
            await nursery.start(astore.run)
            astore.record_event("r1", "received")
            await trio.sleep(0.1)
            astore.record_event("r2", "received")  # during the linger r1 started
            with trio.fail_after(30):
                while astore.statistics().written < 2:
                    await trio.sleep(0.005)
            assert astore.statistics().batches == 1
            await trio.sleep(0.1)
            t1 = trio.current_time()
            astore.record_event("r3", "received")
            with trio.fail_after(30):
                while astore.statistics().written < 3:
                    await trio.sleep(0.005)
            assert trio.current_time() - t1 >= 0.3
            nursery.cancel_scope.cancel()

    trio.run(main)
