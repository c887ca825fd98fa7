"""SemanticCache on real SQLite files with the fake embedder: hits, isolation, bounds, expiry,
restart, corruption, learning."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from meshd.cache import (
    AdaptiveThreshold,
    CacheLimits,
    CacheRequest,
    FixedThreshold,
    SemanticCache,
)
from meshd.testing.fake_embedder import FakeEmbedder

REQ = CacheRequest(model="m@1", tenant="t", client="alice",
                   prompt="what is the capital of france")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _cache(path: Path | str, clock: Clock | None = None, **kw: object) -> SemanticCache:
    kw.setdefault("policy", FixedThreshold(0.85))
    return SemanticCache(path, FakeEmbedder(), clock=clock or Clock(), **kw)  # type: ignore[arg-type]


def test_miss_insert_hit_and_isolation(tmp_path: Path) -> None:
    c = _cache(tmp_path / "c.db")
    first = c.lookup(REQ)
    assert first.kind == "miss" and first.vector is not None
    eid = c.insert(REQ, "Paris", lookup=first)
    hit = c.lookup(replace(REQ, prompt="What is the capital of France?"))
    assert (hit.kind, hit.answer, hit.entry_id) == ("hit", "Paris", eid)
    assert hit.similarity is not None and hit.similarity > 0.99
    assert c.lookup(replace(REQ, client="bob")).kind == "miss"
    assert c.lookup(replace(REQ, model="m@2")).kind == "miss"
    assert c.lookup(replace(REQ, max_tokens=10)).kind == "miss"
    assert c.lookup(replace(REQ, prompt="how tall is mount everest")).kind == "miss"
    sampled = replace(REQ, temperature=0.9)
    assert c.lookup(sampled).kind == "skip" and c.insert(sampled, "x") is None
    s = c.statistics()
    assert (s["entries"], s["hits"], s["skips"], s["inserts"]) == (1, 1, 1, 1)


def test_shared_cache_between_opted_in_clients(tmp_path: Path) -> None:
    c = _cache(tmp_path / "c.db")
    c.insert(replace(REQ, shared=True), "Paris")
    assert c.lookup(replace(REQ, client="bob", shared=True)).answer == "Paris"
    assert c.lookup(replace(REQ, client="bob")).kind == "miss"  # bob did not opt in
    c.insert(replace(REQ, client="carol", prompt="capital of spain"), "Madrid")
    assert c.lookup(replace(REQ, client="bob", shared=True, prompt="capital of spain")
                    ).kind == "miss"  # carol's answer stays hers


def test_guard_refuses_near_miss_and_next_neighbour_answers(tmp_path: Path) -> None:
    c = _cache(tmp_path / "c.db", policy=FixedThreshold(0.5))
    c.insert(replace(REQ, prompt="what is 17 plus 25"), "42")
    c.insert(replace(REQ, prompt="what is 17 plus 26"), "43")
    got = c.lookup(replace(REQ, prompt="What is 17 plus 26?"))
    assert got.answer == "43"
    c2 = _cache(tmp_path / "d.db", policy=FixedThreshold(0.5))
    c2.insert(replace(REQ, prompt="what is 17 plus 25"), "42")
    miss = c2.lookup(replace(REQ, prompt="what is 17 plus 26"))
    assert miss.kind == "miss" and miss.reason == "numbers differ"


def test_lru_eviction_by_entries_and_bytes(tmp_path: Path) -> None:
    clock = Clock()
    c = _cache(tmp_path / "c.db", clock, limits=CacheLimits(max_entries=3, max_bytes=10_000))
    for i in range(3):
        clock.now += 1
        c.insert(replace(REQ, prompt=f"question number {i} about topic {i}"), f"a{i}")
    clock.now += 1
    assert c.lookup(replace(REQ, prompt="question number 0 about topic 0")).kind == "hit"
    clock.now += 1
    c.insert(replace(REQ, prompt="a brand new question"), "new")  # evicts #1, the LRU
    assert len(c) == 3 and c.statistics()["evictions"] == 1
    assert c.lookup(replace(REQ, prompt="question number 1 about topic 1")).kind == "miss"
    assert c.lookup(replace(REQ, prompt="question number 0 about topic 0")).kind == "hit"
    small = _cache(tmp_path / "s.db", clock, limits=CacheLimits(max_bytes=900))
    for i in range(4):
        clock.now += 1
        small.insert(replace(REQ, prompt=f"q{i}"), "x" * 100)
    assert small.statistics()["bytes"] <= 900 and len(small) == 2  # 430 bytes each
    assert small.insert(REQ, "y" * 1000) is None  # alone larger than the bound


def test_a_hit_writes_nothing_until_flush(tmp_path: Path) -> None:
    clock = Clock()
    c = _cache(tmp_path / "c.db", clock)
    eid = c.insert(REQ, "Paris")

    def row() -> tuple[float, int]:
        return tuple(c.db.execute("SELECT last_used, hits FROM entries WHERE id = ?",  # type: ignore[return-value]
                                  [eid]).fetchone())

    before = row()
    changes = c.db.conn.total_changes
    for prompt in (REQ.prompt, "What is the capital of France?"):  # exact, then by meaning
        clock.now += 1
        assert c.lookup(replace(REQ, prompt=prompt)).kind == "hit"
    assert c.db.conn.total_changes == changes and row() == before and c.pending_touches == 1
    c.flush()
    assert row() == (clock.now, 2) and c.pending_touches == 0
    clock.now += 1
    c.lookup(REQ)
    c.close()  # close writes what is pending
    reopened = _cache(tmp_path / "c.db", clock)
    assert tuple(reopened.db.execute("SELECT last_used, hits FROM entries").fetchone()) == (
        clock.now, 3)


def test_lookup_exact_never_waits(tmp_path: Path) -> None:
    import threading

    c = _cache(tmp_path / "c.db")
    eid = c.insert(REQ, "Paris")
    hit = c.lookup_exact(REQ, blocking=False)
    assert hit is not None and (hit.kind, hit.answer, hit.entry_id) == ("hit", "Paris", eid)
    assert c.lookup_exact(replace(REQ, prompt="What is the capital of France?")) is None
    assert c.lookup_exact(replace(REQ, client="bob")) is None  # another client's entry
    assert c.lookup_exact(replace(REQ, temperature=0.9)) is None  # not cacheable
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with c._lock:
            held.set()
            release.wait(10)

    t = threading.Thread(target=hold)
    t.start()
    held.wait(10)
    try:
        assert c.lookup_exact(REQ, blocking=False) is None  # busy: the caller takes lookup()
    finally:
        release.set()
        t.join()
    assert c.lookup_exact(REQ, blocking=False) is not None
    assert c.statistics()["hits"] == 2


def test_ttl(tmp_path: Path) -> None:
    clock = Clock()
    c = _cache(tmp_path / "c.db", clock, limits=CacheLimits(ttl_s=60))
    c.insert(REQ, "Paris")
    clock.now += 59
    assert c.lookup(REQ).kind == "hit"  # a hit does not extend the life of an answer
    clock.now += 2
    assert c.lookup(REQ).kind == "miss" and len(c) == 0


def test_survives_restart(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    c = _cache(path, exact_max=8)
    for i in range(20):  # past exact_max: the partition becomes an HNSW graph
        c.insert(replace(REQ, prompt=f"distinct question {i} on subject {i * 7}"), f"a{i}")
    c.insert(replace(REQ, client="bob"), "Paris")
    assert c.statistics()["index_kinds"] == {"hnsw": 1, "exact": 1}
    c.close()
    again = _cache(path, exact_max=8)
    assert len(again) == 21
    assert again.lookup(replace(REQ, prompt="distinct question 13 on subject 91")).answer == "a13"
    assert again.lookup(replace(REQ, client="bob")).answer == "Paris"


def test_corrupt_file_is_rebuilt_with_a_warning(tmp_path: Path,
                                                caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "c.db"
    c = _cache(path)
    c.insert(REQ, "Paris")
    c.close()
    path.write_bytes(b"this is not a database" * 100)
    with caplog.at_level(logging.WARNING, logger="meshd.cache.store"):
        again = _cache(path)
    assert "semantic cache rebuilt" in caplog.text
    assert len(again) == 0 and again.lookup(REQ).kind == "miss"
    again.insert(REQ, "Paris")
    assert again.lookup(REQ).answer == "Paris"
    assert list(tmp_path.glob("c.db.corrupt-*"))


def test_corruption_while_open_is_a_miss_not_a_crash(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    c = _cache(path)
    c.insert(REQ, "Paris")
    c.db.execute("DROP TABLE entries")  # what a damaged page would look like to a query
    assert c.lookup(REQ).kind == "miss"
    assert c.statistics()["rebuilds"] == 1
    c.insert(REQ, "Paris")
    assert c.lookup(REQ).answer == "Paris"


def test_embedder_change_clears_the_cache(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    c = _cache(path)
    c.insert(REQ, "Paris")
    c.close()
    other = SemanticCache(path, FakeEmbedder(identity="other@1"), clock=Clock())
    assert len(other) == 0


def test_adaptive_entry_learns_from_verifications(tmp_path: Path) -> None:
    policy = AdaptiveThreshold(prior_t=0.8, explore=0.0)
    c = SemanticCache(tmp_path / "c.db", FakeEmbedder(), policy=policy, clock=Clock(),
                      rng=lambda: 0.5)
    c.insert(REQ, "Paris")
    near = replace(REQ, prompt="what is the capital of france please")  # 0.931
    first = c.lookup(near)
    assert first.kind == "verify" and first.answer == "Paris"
    assert first.similarity is not None and first.similarity < policy.threshold(())
    rounds = 0
    while (got := c.lookup(near)).kind == "verify" and rounds < 32:
        assert c.verify(got, "Paris") is True  # the node computed it, and it was the same
        rounds += 1
    assert got.kind == "hit" and 3 <= rounds < 32
    c.verify(replace(c.lookup(near), kind="verify"), "Lyon")  # a wrong one raises it again
    c.verify(replace(c.lookup(near), kind="verify"), "Lyon")
    assert c.lookup(near).kind == "verify"


def test_vectors_round_trip_through_sqlite(tmp_path: Path) -> None:
    c = _cache(tmp_path / "c.db")
    eid = c.insert(REQ, "Paris")
    raw = c.db.execute("SELECT vector FROM entries WHERE id = ?", [eid]).fetchone()[0]
    np.testing.assert_array_equal(np.frombuffer(raw, np.float32),
                                  FakeEmbedder().embed([REQ.prompt])[0])


def test_saved_graph_is_loaded_and_a_stale_one_is_not(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    c = _cache(path, exact_max=8)
    for i in range(20):
        c.insert(replace(REQ, prompt=f"distinct question {i} on subject {i * 7}"), f"a{i}")
    c.close()
    graphs = list(tmp_path.glob("c.db.hnsw-*"))
    assert len(graphs) == 1
    again = _cache(path, exact_max=8)  # loads the graph: answers as before
    assert again.lookup(replace(REQ, prompt="distinct question 4 on subject 28")).answer == "a4"
    again.insert(replace(REQ, prompt="one more question"), "b")
    again.db.conn.close()  # a crash: no close(), so the saved graph is stale
    third = _cache(path, exact_max=8)
    assert len(third) == 21
    assert third.lookup(replace(REQ, prompt="one more question")).answer == "b"
    third.close()
    graphs[0].write_bytes(b"garbage" * 1000)  # a damaged graph file is rebuilt from the rows
    fourth = _cache(path, exact_max=8)
    assert fourth.lookup(replace(REQ, prompt="one more question")).answer == "b"


def test_exact_repeat_needs_no_embedding(tmp_path: Path) -> None:
    emb = FakeEmbedder()
    c = SemanticCache(tmp_path / "c.db", emb, clock=Clock())
    c.insert(REQ, "Paris")
    calls = emb.calls
    got = c.lookup(replace(REQ, prompt="what is the   capital of france"))
    assert (got.kind, got.answer, got.reason, got.similarity) == ("hit", "Paris", "same prompt", 1.0)
    assert emb.calls == calls
    assert c.lookup(replace(REQ, client="bob")).kind == "miss"  # partitions still apply
