"""SemanticCache on real SQLite files with the fake embedder and a fake verifier: the exact
path (with no model at all), the semantic path within the bound, isolation, feedback, bounds,
expiry, restart, corruption."""

from __future__ import annotations

import logging
import re
import threading
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from meshd.cache import CacheLimits, CacheRequest, Calibration, SemanticCache
from meshd.cache.store import Busy
from meshd.testing.fake_embedder import FakeEmbedder

REQ = CacheRequest(model="m@1", tenant="t", client="alice",
                   prompt="what is the capital of france")
# 1,000 labelled near misses, six of them scored at or above the gate: at max_error 0.01 four
# may be served, so a hit must score above the fifth, 0.9 (meshd.cache.bound)
CAL = Calibration(0.5, 1000, (0.99, 0.99, 0.99, 0.99, 0.9, 0.6))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Overlap:
    """A fake verifier: the share of words the two questions share (Jaccard), counted."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, str]] = []

    def __call__(self, cached: str, query: str) -> float:
        self.asked.append((cached, query))
        a, b = (set(re.findall(r"\w+", t.lower())) for t in (cached, query))
        return len(a & b) / len(a | b)


def _cache(path: Path | str, clock: Clock | None = None, **kw: object) -> SemanticCache:
    kw.setdefault("verifier", Overlap())
    kw.setdefault("calibration", CAL)
    emb = kw.pop("embedder", FakeEmbedder())
    return SemanticCache(path, emb, clock=clock or Clock(), **kw)  # type: ignore[arg-type]


def test_miss_insert_hit_and_isolation(tmp_path: Path) -> None:
    c = _cache(tmp_path / "c.db")
    first = c.lookup(REQ)
    assert first.kind == "miss" and first.vector is not None
    eid = c.insert(REQ, "Paris", vector=first.vector)
    assert c.lookup(REQ).kind == "exact"
    hit = c.lookup(replace(REQ, prompt="What is the capital of France?"))  # not word for word
    assert (hit.kind, hit.answer, hit.entry_id) == ("semantic", "Paris", eid)
    assert hit.similarity is not None and hit.similarity > 0.99
    assert hit.score == 1.0 and hit.threshold == 0.9
    assert c.lookup(replace(REQ, client="bob")).kind == "miss"
    assert c.lookup(replace(REQ, model="m@2")).kind == "miss"
    assert c.lookup(replace(REQ, max_tokens=10)).kind == "miss"
    assert c.lookup(replace(REQ, context="a system prompt")).kind == "miss"
    assert c.lookup(replace(REQ, prompt="how tall is mount everest")).kind == "miss"
    sampled = replace(REQ, temperature=0.9)
    assert c.lookup(sampled).kind == "skip" and c.insert(sampled, "x") is None
    s = c.statistics()
    assert (s["entries"], s["exact_hits"], s["semantic_hits"], s["skips"], s["inserts"]) == (
        1, 1, 1, 1, 1)


def test_shared_cache_between_opted_in_clients(tmp_path: Path) -> None:
    c = _cache(tmp_path / "c.db")
    c.insert(replace(REQ, shared=True), "Paris")
    assert c.lookup(replace(REQ, client="bob", shared=True)).answer == "Paris"
    assert c.lookup(replace(REQ, client="bob")).kind == "miss"  # bob did not opt in
    c.insert(replace(REQ, client="carol", prompt="capital of spain"), "Madrid")
    assert c.lookup(replace(REQ, client="bob", shared=True, prompt="capital of spain")
                    ).kind == "miss"  # carol's answer stays hers


def test_the_bound_refuses_below_its_threshold_and_a_looser_bound_serves(tmp_path: Path) -> None:
    verifier = Overlap()
    c = _cache(tmp_path / "c.db", verifier=verifier)
    c.insert(REQ, "Paris")
    near = replace(REQ, prompt="what is the capital of france in winter")  # overlap 0.75
    got = c.lookup(near)
    assert got.kind == "refused" and got.score == 0.75 and got.threshold == 0.9
    assert verifier.asked[-1] == (REQ.prompt, near.prompt)  # (cached, query), as trained
    assert c.lookup(replace(near, max_error=0.05)).kind == "semantic"  # its own bound
    n = len(verifier.asked)
    assert c.lookup(replace(REQ, prompt="bake a chocolate cake")).kind == "miss"  # below the gate
    assert len(verifier.asked) == n
    assert c.statistics()["refused"] == 1


def test_a_bound_the_calibration_cannot_support_refuses_without_embedding(tmp_path: Path) -> None:
    emb = FakeEmbedder()
    c = _cache(tmp_path / "c.db", embedder=emb)
    c.insert(REQ, "Paris")
    calls = emb.calls
    got = c.lookup(replace(REQ, prompt="What is the capital of France?", max_error=0.001))
    assert got.kind == "refused" and "cannot hold" in got.reason
    assert emb.calls == calls and c.threshold(0.001) is None  # 1,000 cannot support 0.1%
    assert c.lookup(replace(REQ, max_error=0.001)).kind == "exact"  # repeats still
    no_cal = _cache(tmp_path / "d.db", calibration=None)
    no_cal.insert(REQ, "Paris")
    assert no_cal.lookup(replace(REQ, prompt="What is the capital of France?")).kind == "refused"


def test_exact_repeats_need_no_model_at_all(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    c = SemanticCache(path, clock=Clock())  # no embedder: exact repeats only
    assert not c.semantic
    staged = c.stage(REQ, "Paris")  # what the daemon does when the answer goes out
    got = c.lookup_exact(replace(REQ, prompt="what is  the capital of france "))
    assert got is not None and (got.kind, got.answer, got.entry_id) == ("exact", "Paris", None)
    assert staged == (got.partition, got.key)
    eid = c.insert(REQ, "Paris")
    got = c.lookup_exact(REQ)
    assert got is not None and got.entry_id == eid and not c._staged
    miss = c.lookup(replace(REQ, prompt="What is the capital of France?"))
    assert (miss.kind, miss.reason) == ("miss", "no embedding model yet")
    assert c.db.execute("SELECT vector FROM entries").fetchone()[0] is None
    emb = FakeEmbedder()
    c.attach(emb, Overlap(), CAL)  # the model arrives: the row is embedded then
    assert emb.calls == 1
    assert c.lookup(replace(REQ, prompt="What is the capital of France?")).answer == "Paris"


def test_a_follow_up_is_served_on_an_exact_repeat_only(tmp_path: Path) -> None:
    emb = FakeEmbedder()
    c = _cache(tmp_path / "c.db", embedder=emb)
    follow = replace(REQ, prompt="and of germany", context="turns of conversation one",
                     follow_up=True)
    calls = emb.calls
    assert c.lookup(follow).kind == "miss" and emb.calls == calls  # no embedding
    c.insert(follow, "Berlin")
    assert emb.calls == calls  # never searched by meaning: no vector
    assert c.lookup(follow).answer == "Berlin"
    assert c.lookup(replace(follow, context="turns of conversation two")).kind == "miss"
    assert c.lookup(replace(follow, prompt="And of Germany?")).kind == "miss"


def test_wrong_feedback_removes_the_entry_and_raises_the_threshold(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    c = _cache(path)
    c.insert(REQ, "Paris")
    near = replace(REQ, prompt="What is the capital of France?")
    got = c.lookup(near)
    assert got.kind == "semantic" and got.score == 1.0 and c.threshold(0.01) == 0.9
    removed = c.forget(entry_id=got.entry_id, partition=got.partition, key=got.key,
                       wrong_score=got.score)
    assert removed == 1 and len(c) == 0 and not c.lookup(REQ).hit
    assert c.threshold(0.01) == 0.99  # one more near miss, served at 1.0: the bar rises
    c.insert(REQ, "Lyon")  # an exact entry reported wrong: removed, the bound untouched
    hit = c.lookup(REQ)
    assert c.forget(partition=hit.partition, key=hit.key) == 1 and c.threshold(0.01) == 0.99
    s = c.statistics()
    assert (s["feedback_wrong"], s["wrong_scores"]) == (2, 1)
    c.close()
    again = _cache(path)  # the feedback is kept in the file
    assert again.threshold(0.01) == 0.99


def test_lru_eviction_by_entries_and_bytes(tmp_path: Path) -> None:
    clock = Clock()
    c = _cache(tmp_path / "c.db", clock, limits=CacheLimits(max_entries=3, max_bytes=10_000))
    for i in range(3):
        clock.now += 1
        c.insert(replace(REQ, prompt=f"question number {i} about topic {i}"), f"a{i}")
    clock.now += 1
    assert c.lookup(replace(REQ, prompt="question number 0 about topic 0")).hit
    clock.now += 1
    c.insert(replace(REQ, prompt="a brand new question"), "new")  # evicts #1, the LRU
    assert len(c) == 3 and c.statistics()["evictions"] == 1
    assert not c.lookup(replace(REQ, prompt="question number 1 about topic 1")).hit
    assert c.lookup(replace(REQ, prompt="question number 0 about topic 0")).hit
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
        assert c.lookup(replace(REQ, prompt=prompt)).hit
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
    c = _cache(tmp_path / "c.db")
    eid = c.insert(REQ, "Paris")
    hit = c.lookup_exact(REQ, blocking=False)
    assert hit is not None and (hit.kind, hit.answer, hit.entry_id) == ("exact", "Paris", eid)
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
        with pytest.raises(Busy):  # busy: the caller waits in a thread of its own
            c.lookup_exact(REQ, blocking=False)
        c.stage(REQ, "Paris")  # an answer being stored is found without the lock
        assert c.lookup_exact(REQ, blocking=False) is not None
    finally:
        release.set()
        t.join()
    assert c.lookup_exact(REQ, blocking=False) is not None
    assert c.statistics()["exact_hits"] == 3


def test_ttl(tmp_path: Path) -> None:
    clock = Clock()
    c = _cache(tmp_path / "c.db", clock, limits=CacheLimits(ttl_s=60))
    c.insert(REQ, "Paris")
    clock.now += 59
    assert c.lookup(REQ).kind == "exact"  # a hit does not extend the life of an answer
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


def test_an_embedder_change_embeds_the_questions_again(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    c = _cache(path)
    c.insert(REQ, "Paris")
    c.close()
    other_model = FakeEmbedder(dim=16, identity="other@1")
    other = _cache(path, embedder=other_model)  # vectors of two models do not compare
    assert len(other) == 1 and other_model.calls == 1
    assert other.lookup(replace(REQ, prompt="What is the capital of France?")).answer == "Paris"


def test_a_version_1_file_is_opened_and_kept(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "c.db"
    con = sqlite3.connect(path)
    con.executescript(
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT);"
        "INSERT INTO meta VALUES ('schema', '1'), ('embedder', 'fake-embedder@0');"
        "CREATE TABLE entries (id INTEGER PRIMARY KEY, partition TEXT, prompt_key TEXT, "
        "prompt TEXT, answer TEXT, vector BLOB, created_at FLOAT, last_used FLOAT, "
        "expires_at FLOAT, hits INTEGER, nbytes INTEGER, observations TEXT);")
    from meshd.cache.keys import admit, prompt_key

    vec = FakeEmbedder().embed([REQ.prompt])[0]
    con.execute("INSERT INTO entries VALUES (1, ?, ?, ?, 'Paris', ?, 1, 1, 9e9, 0, 500, '[]')",
                [admit(REQ).write, prompt_key(REQ.prompt), REQ.prompt, vec.tobytes()])
    con.commit()
    con.close()
    c = _cache(path)
    assert c.lookup(REQ).answer == "Paris"
    para = c.lookup(replace(REQ, prompt="What is the capital of France?"))
    assert (para.answer, para.answer_ids) == ("Paris", None)  # tokenized when served
    eid = c.insert(replace(REQ, prompt="how tall is mount everest"), "8,849 m", answer_ids=[7])
    assert eid is not None and c.lookup(replace(REQ, prompt="how tall is mount everest")
                                        ).answer_ids == (7,)


def test_an_answers_token_ids_are_kept_with_it(tmp_path: Path) -> None:
    """A hit serves the ids stored with its answer (computed when it was stored), exact or
    semantic, also after a restart; an answer stored without them has none."""
    path = tmp_path / "c.db"
    c = _cache(path)
    c.insert(REQ, "Paris", answer_ids=[9, 70000, 2**31 - 1])
    para = replace(REQ, prompt="What is the capital of France?")
    assert c.lookup(REQ).answer_ids == (9, 70000, 2**31 - 1)
    assert c.lookup(para).answer_ids == (9, 70000, 2**31 - 1)
    c.insert(replace(REQ, client="bob"), "Paris")
    assert c.lookup(replace(REQ, client="bob")).answer_ids is None
    c.close()
    again = _cache(path)
    assert [again.lookup(r).answer_ids for r in (REQ, para)] == [(9, 70000, 2**31 - 1)] * 2


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
    c = _cache(tmp_path / "c.db", embedder=emb)
    c.insert(REQ, "Paris")
    calls = emb.calls
    got = c.lookup(replace(REQ, prompt="what is the   capital of france"))
    assert (got.kind, got.answer, got.reason, got.similarity) == (
        "exact", "Paris", "same request", 1.0)
    assert emb.calls == calls
    assert c.lookup(replace(REQ, client="bob")).kind == "miss"  # partitions still apply


def test_lookup_semantic_reads_no_exact_row(tmp_path: Path) -> None:
    """The daemon's worker thread takes the semantic path alone after the event loop's exact
    miss: the same decision as ``lookup``'s second half, without reading the exact row again."""
    c = _cache(tmp_path / "c.db")
    eid = c.insert(REQ, "Paris")
    statements: list[str] = []
    c.db.conn.set_trace_callback(statements.append)
    got = c.lookup_semantic(REQ)  # word for word, but found by meaning
    c.db.conn.set_trace_callback(None)
    assert (got.kind, got.answer, got.entry_id) == ("semantic", "Paris", eid)
    assert not any("prompt_key" in s for s in statements)  # no exact read
    assert [s for s in statements if s.startswith("SELECT")] == [
        f"SELECT prompt, answer, expires_at, partition, answer_ids FROM entries WHERE id = {eid}"]
    para = replace(REQ, prompt="What is the capital of France?")
    alone, both = c.lookup_semantic(para), c.lookup(para)
    assert [(g.kind, g.answer, g.similarity, g.score, g.threshold) for g in (alone, both)] == [
        ("semantic", "Paris", both.similarity, 1.0, 0.9)] * 2
    assert c.lookup_semantic(replace(REQ, client="bob")).kind == "miss"
    assert c.lookup_semantic(replace(REQ, temperature=0.9)).kind == "skip"
    assert c.lookup_semantic(replace(REQ, follow_up=True)).kind == "miss"  # exact only
    s = c.statistics()
    assert (s["exact_hits"], s["semantic_hits"], s["misses"], s["skips"]) == (0, 3, 2, 1)
    assert s["lookups"] == 5


class SlowVerifier(Overlap):
    """The fake verifier, burning a known amount of the calling thread's CPU per call."""

    def __call__(self, cached: str, query: str) -> float:
        end = time.thread_time() + 0.005
        while time.thread_time() < end:
            pass
        return super().__call__(cached, query)


def test_a_semantic_lookup_says_where_its_time_went(tmp_path: Path) -> None:
    """``search_ms`` splits into the index (with the entry's row) and the verifier, and the
    verifier's CPU time is the looking-up thread's: 5 ms burnt by the fake shows in both."""
    v = SlowVerifier()
    c = _cache(tmp_path / "c.db", verifier=v)
    c.insert(REQ, "Paris")
    hit = c.lookup(replace(REQ, prompt="What is the capital of France?"))
    assert hit.kind == "semantic" and len(v.asked) == 1
    assert hit.verify_cpu_ms >= 5.0 and hit.verify_ms >= hit.verify_cpu_ms - 0.5
    assert hit.index_ms > 0 and hit.embed_ms > 0 and hit.embed_cpu_ms >= 0
    assert abs(hit.search_ms - (hit.index_ms + hit.verify_ms)) < 0.5
    far = c.lookup(replace(REQ, prompt="how tall is mount everest"))  # below the gate
    assert far.kind == "miss" and len(v.asked) == 1 and far.verify_cpu_ms < 1.0
