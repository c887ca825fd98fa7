"""The semantic cache at the entry node, on real daemons with the real embedding model and real
SQLite (issue 15): a paraphrase is answered from the cache of the node it entered, a different
client is not, `cache: false` stays out, entries survive a restart, and the bound holds."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from meshd.testing.wait import wait_for
from meshd.testnet.drive import cli as meshd
from meshd.testnet.drive import stream
from meshd.testnet.launcher import NodeSpec, down, up

pytestmark = pytest.mark.slow

ASKED = "How many days are there in a leap year?"
PARAPHRASE = "In a leap year, how many days are there?"


def specs() -> list[NodeSpec]:
    return [NodeSpec(name="c1", extra={"cache": {"enabled": True, "max_entries": 3}}),
            NodeSpec(name="c2", extra={"cache": {"enabled": True}})]


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory, shipped_model: None) -> Iterator[dict[str, Any]]:
    d = tmp_path_factory.mktemp("cache")
    index = up(d, specs(), advert_interval_s=1.0)
    try:
        yield {"dir": d, "index": index}
    finally:
        down(d)


def sock(mesh: dict[str, Any], name: str) -> str:
    return next(n["socket"] for n in mesh["index"]["nodes"] if n["name"] == name)


def cache_stats(s: str) -> dict[str, Any]:
    return dict(json.loads(meshd("cache", "stats", "--json", "--socket", s).stdout))


def ask(s: str, prompt: str, **extra: Any) -> dict[str, Any]:
    fields = {"prompt": prompt, "max_tokens": 12, "temperature": 0.0, **extra}
    out: dict[str, Any] = trio.run(stream, s, fields)["stats"]
    return out


def warm(s: str) -> None:
    """The cache loads its model on the first request it could take (a node that never gets one
    stays light): ask once, then wait for it."""
    assert cache_stats(s)["state"] in ("idle", "loading", "ready")
    ask(s, "Warm up.", client="warmup")
    wait_for(lambda: cache_stats(s)["state"] == "ready", 180, "the semantic cache to load")


def test_a_paraphrase_is_answered_from_the_entry_nodes_cache(mesh: dict[str, Any]) -> None:
    s1 = sock(mesh, "c1")
    warm(s1)
    first = ask(s1, ASKED, client="alice")
    assert not first["cached"]
    wait_for(lambda: cache_stats(s1)["inserts"] >= 1, 30, "the answer to be stored")
    again = ask(s1, PARAPHRASE, client="alice")
    assert again["cached"] is True and again["served_by"] == "c1" and again["route"] == ["c1"]
    assert again["text"] == first["text"]  # the greedy answer, not run again
    # the default verifier (the learned pair verifier) brings its own threshold
    from meshd.embed.pair_verifier import read_info, shipped_verifier
    want = read_info(shipped_verifier()).threshold
    assert again["cache"]["similarity"] >= again["cache"]["threshold"] == want
    # the same question from another client is not served alice's answer
    assert not ask(s1, PARAPHRASE, client="bob")["cached"]
    # cache: false stays out
    assert not ask(s1, ASKED, client="alice", cache=False)["cached"]
    # the other node has its own cache: nothing of c1's
    s2 = sock(mesh, "c2")
    warm(s2)
    assert not ask(s2, PARAPHRASE, client="alice")["cached"]
    # the HTTP API marks a hit with x-meshd-cache (the testnet's key is client "testnet")
    n1 = next(n for n in mesh["index"]["nodes"] if n["name"] == "c1")
    key = (Path(mesh["dir"]) / "api-key").read_text().strip()
    body = {"model": "tiny-en", "prompt": ASKED, "max_tokens": 12, "temperature": 0}
    before = cache_stats(s1)["inserts"]
    for expect_hit in (False, True):
        if expect_hit:
            wait_for(lambda: cache_stats(s1)["inserts"] > before, 30, "the API answer to be stored")
        r = httpx.post(f"{n1['api_url']}/completions", json=body, timeout=60,
                       headers={"authorization": f"Bearer {key}"})
        assert r.status_code == 200, r.text
        assert (r.headers.get("x-meshd-cache") == "hit") is expect_hit
    # POST /v1/embeddings answers with the node's sentence-embedding model, in OpenAI's shape
    r = httpx.post(f"{n1['api_url']}/embeddings", timeout=60,
                   json={"input": [ASKED, PARAPHRASE, "Who wrote the Iliad?"]},
                   headers={"authorization": f"Bearer {key}"})
    assert r.status_code == 200, r.text
    got = r.json()
    assert got["object"] == "list" and got["model"] == "all-minilm-l6-v2"
    vecs = [d["embedding"] for d in got["data"]]
    assert [d["index"] for d in got["data"]] == [0, 1, 2] and len(vecs[0]) == 384
    dot = [sum(a * b for a, b in zip(vecs[0], v, strict=True)) for v in vecs]
    assert abs(dot[0] - 1) < 1e-4 and dot[1] > 0.9 > dot[2]  # paraphrase near, other far
    assert got["usage"]["prompt_tokens"] > 0
    bad = httpx.post(f"{n1['api_url']}/embeddings", json={"input": []}, timeout=30,
                     headers={"authorization": f"Bearer {key}"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "input"
    # explain shows the hit: the journal of the request has the cache_hit event
    rid = again["request_id"]
    explained = json.loads(meshd("explain", rid, "--json", "--socket", s1).stdout)
    hit = next(e["payload"] for e in explained["events"] if e["kind"] == "cache_hit")
    assert hit["entry"] == again["cache"]["entry"] and hit["similarity"] >= hit["threshold"]
    # ... and where the lookup's time went: the paraphrase was embedded and searched
    assert hit["embed_ms"] > 0 and hit["search_ms"] > 0
    assert all(hit[k] >= 0 for k in ("start_ms", "queued_ms", "handoff_ms"))


def test_the_bound_holds_and_entries_survive_a_restart(mesh: dict[str, Any]) -> None:
    s1 = sock(mesh, "c1")
    warm(s1)
    before = cache_stats(s1)["inserts"]
    for q in ("What is the capital of France?", "Who wrote the Iliad?",
              "How far is the moon from the earth?", "What colour is the sky?"):
        ask(s1, q, client="carol")
    wait_for(lambda: cache_stats(s1)["inserts"] >= before + 4, 60, "the answers to be stored")
    stats = cache_stats(s1)
    assert stats["entries"] <= 3  # [cache] max_entries = 3: the oldest were evicted
    kept = ask(s1, "What colour is the sky?", client="carol")
    assert kept["cached"]
    down(mesh["dir"])
    mesh["index"] = up(Path(mesh["dir"]), specs(), advert_interval_s=1.0)
    s1 = sock(mesh, "c1")
    warm(s1)
    assert cache_stats(s1)["entries"] >= 1
    assert ask(s1, "What colour is the sky?", client="carol")["cached"]


def _stamps(db_path: Path) -> tuple[dict[str, str], dict[str, str]]:
    """(each partition's rows as ``count:max(id):sum(id)``, the stamps of the saved graphs)."""
    import sqlite3

    con = sqlite3.connect(db_path)
    try:
        rows = {r[0]: f"{r[1]}:{r[2]}:{r[3]}" for r in con.execute(
            "SELECT partition, count(*), max(id), sum(id) FROM entries GROUP BY partition")}
        saved = {k.removeprefix("index:"): v for k, v in con.execute(
            "SELECT key, value FROM meta WHERE key LIKE 'index:%'")}
    finally:
        con.close()
    return rows, saved


def test_a_stopped_daemon_saves_its_index_for_the_next_start(tmp_path: Path,
                                                             shipped_model: None) -> None:
    """A cache big enough for an HNSW graph (over 4,096 entries in a partition) gets its graph
    saved when the daemon stops, stamped with the rows it holds then: the next start loads it
    instead of rebuilding it from every row."""
    import numpy as np

    from meshd.cache import CacheLimits, FixedThreshold, SemanticCache
    from meshd.cache.eviction import entry_bytes
    from meshd.cache.index import EXACT_MAX
    from meshd.cache.keys import prompt_key
    from meshd.embed import load_embedder

    spec = [NodeSpec(name="g1", extra={"cache": {"enabled": True}})]
    d = tmp_path / "net"
    db = d / "g1" / "state" / "semantic-cache.db"
    index = up(d, spec, advert_interval_s=1.0)
    try:
        s = index["nodes"][0]["socket"]
        warm(s)
        ask(s, "How tall is the Eiffel Tower?", client="dave")
        wait_for(lambda: cache_stats(s)["inserts"] >= 1, 60, "the answer to be stored")
    finally:
        down(d)
    # fill the partition past the exact-search bound, as the daemon's own format, and let an
    # in-process open build and save the graph
    emb = load_embedder(precision="int8")
    limits = CacheLimits(max_entries=EXACT_MAX * 2, max_bytes=2**36)
    cache = SemanticCache(db, emb, policy=FixedThreshold(), limits=limits)
    part = cache.db.execute("SELECT partition FROM entries LIMIT 1").fetchone()[0]
    rng = np.random.default_rng(0)
    now = time.time()
    batch = []
    for i in range(EXACT_MAX + 100):
        v = rng.standard_normal(emb.dim).astype(np.float32)
        v /= np.linalg.norm(v)
        p, a = f"filler {i}", f"answer {i}"
        batch.append((part, prompt_key(p), p, a, v.tobytes(), now, now - 60, now + 86400, 0,
                      entry_bytes(p, a, emb.dim), "[]"))
    with cache.db.conn:
        cache.db.conn.executemany(
            "INSERT INTO entries (partition, prompt_key, prompt, answer, vector, created_at, "
            "last_used, expires_at, hits, nbytes, observations) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
            batch)
    cache.close()
    cache = SemanticCache(db, emb, policy=FixedThreshold(), limits=limits)
    cache.close()
    rows, saved = _stamps(db)
    assert saved[part] == rows[part]  # the graph of the filled partition, saved
    # the daemon again: one more answer stored, then stopped
    index = up(d, spec, advert_interval_s=1.0)
    try:
        s = index["nodes"][0]["socket"]
        warm(s)
        assert cache_stats(s)["entries"] == EXACT_MAX + 101
        ask(s, "Who painted the Mona Lisa?", client="dave")
        wait_for(lambda: cache_stats(s)["inserts"] >= 1, 60, "the answer to be stored")
    finally:
        down(d)
    rows2, saved2 = _stamps(db)
    assert rows2[part] != rows[part]  # the new answer went into the filled partition
    assert saved2[part] == rows2[part]  # ... and the graph saved at the stop holds it
