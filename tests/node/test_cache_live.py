"""The answer cache at the entry node, on real daemons with the real embedding model, the pair
verifier and real SQLite: an exact repeat is answered on the node it entered right after the
first answer, without the embedding model; a paraphrase within the error bound is answered
from the cache too, a different client is not, `cache: false` stays out; wrong-answer feedback
removes an entry; entries survive a restart, and the size bound holds. On a node that serves no
model, the forward to a peer races the lookup and a hit wins."""

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
            NodeSpec(name="c2", extra={"cache": {"enabled": True}}),
            # exact repeats only: the embedding model is never loaded
            NodeSpec(name="c3", extra={"cache": {"enabled": True, "max_error": 0.0}}),
            # serves no model: every request is forwarded, racing the semantic lookup here
            NodeSpec(name="c4", models=[], extra={"cache": {"enabled": True}})]


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
    """The cache loads its model on the first request the semantic path could take (a node
    that never gets one stays light; an exact repeat is not one): ask a new question once,
    then wait for it."""
    assert cache_stats(s)["state"] in ("idle", "loading", "ready")
    ask(s, f"Warm up number {time.monotonic_ns()}.", client="warmup")
    wait_for(lambda: cache_stats(s)["state"] == "ready", 180, "the semantic cache to load")


def api(mesh: dict[str, Any], name: str) -> tuple[str, dict[str, str]]:
    """(the node's API URL, the testnet key's headers: client "testnet")."""
    n = next(n for n in mesh["index"]["nodes"] if n["name"] == name)
    key = (Path(mesh["dir"]) / "api-key").read_text().strip()
    return n["api_url"], {"authorization": f"Bearer {key}"}


def test_an_exact_repeat_is_answered_at_once_without_the_embedding_model(
        mesh: dict[str, Any]) -> None:
    """Right after the first answer, with nothing waited for, the same greedy request is
    answered from the cache of the node it entered, by the exact path: on the node whose cache
    never loads an embedding model too."""
    url, headers = api(mesh, "c3")
    s3 = sock(mesh, "c3")
    wait_for(lambda: cache_stats(s3).get("entries") is not None, 60, "the cache file to open")
    body = {"model": "tiny-en", "prompt": "Name three primary colours.", "max_tokens": 8,
            "temperature": 0}
    first = httpx.post(f"{url}/completions", json=body, headers=headers, timeout=60)
    again = httpx.post(f"{url}/completions", json=body, headers=headers, timeout=60)
    assert first.status_code == again.status_code == 200, (first.text, again.text)
    assert first.headers["x-meshd-cache"] == "miss" and again.headers["x-meshd-cache"] == "exact"
    assert again.headers["x-meshd-served-by"] == "c3"
    assert again.json()["choices"][0]["text"] == first.json()["choices"][0]["text"]
    st = cache_stats(s3)
    assert st["state"] == "idle" and not st["semantic"]  # the model was never loaded...
    assert st["embedded"] == 0  # ... nor any question embedded
    assert (st["exact_hits"], st["misses"]) == (1, 1)
    # and through the control socket, on a node whose model is still loading or not
    s2 = sock(mesh, "c2")
    wait_for(lambda: cache_stats(s2).get("entries") is not None, 60, "the cache file to open")
    one = ask(s2, "Which planet is the largest?", client="erin")
    two = ask(s2, "Which planet is the largest?", client="erin")
    assert not one["cached"] and two["cached"] and two["cache"]["kind"] == "exact"
    assert two["served_by"] == "c2" and two["text"] == one["text"]
    explained = json.loads(meshd("explain", two["request_id"], "--json", "--socket", s2).stdout)
    hit = next(e["payload"] for e in explained["events"] if e["kind"] == "cache_hit")
    assert hit["kind"] == "exact" and "embed_ms" not in hit  # no embedding for it


def test_wrong_answer_feedback_removes_the_entry(mesh: dict[str, Any]) -> None:
    url, headers = api(mesh, "c3")
    s3 = sock(mesh, "c3")
    q = {"prompt": "Spell the word cat backwards.", "client": "frank"}
    ask(s3, **q)
    served = ask(s3, **q)
    assert served["cached"]
    out = meshd("cache", "feedback", served["request_id"], "--wrong", "--json", "--socket", s3)
    assert json.loads(out.stdout)["removed"] == 1
    assert not ask(s3, **q)["cached"]  # the model answers again
    again = ask(s3, **q)  # ... and its answer is kept
    r = httpx.post(f"{url}/cache/feedback", headers=headers, timeout=30,
                   json={"request_id": again["request_id"], "verdict": "right"})
    assert r.status_code == 200 and r.json()["removed"] == 0
    st = cache_stats(s3)
    assert (st["feedback_wrong"], st["feedback_right"]) == (1, 1)
    metrics = httpx.get(url.removesuffix("/v1") + "/metrics", timeout=30).text
    assert 'meshd_cache_feedback_total{verdict="wrong"} 1.0' in metrics
    assert 'meshd_cache_lookups_total{result="exact"}' in metrics


def test_a_paraphrase_is_answered_from_the_entry_nodes_cache(mesh: dict[str, Any]) -> None:
    s1 = sock(mesh, "c1")
    warm(s1)
    stored = cache_stats(s1)["inserts"]
    first = ask(s1, ASKED, client="alice")
    assert not first["cached"]
    wait_for(lambda: cache_stats(s1)["inserts"] > stored, 30, "the answer to be stored")
    again = ask(s1, PARAPHRASE, client="alice")
    assert again["cached"] is True and again["served_by"] == "c1" and again["route"] == ["c1"]
    assert again["text"] == first["text"]  # the greedy answer, not run again
    # served by the semantic path, above the threshold the calibration gives at the default
    from meshd.cache.bound import threshold
    from meshd.embed.pair_verifier import read_calibration
    how = again["cache"]
    assert how["kind"] == "semantic"
    assert how["score"] > how["threshold"] == round(threshold(read_calibration(), 0.01), 4)
    # the answer's token ids were kept with it when it was stored, and the hit serves them:
    # the answer's text as the model's tokenizer encodes it (no leading BOS)
    import sqlite3

    import numpy as np

    from meshd.engine import default_model_path, load_model

    db = sqlite3.connect(f"file:{Path(mesh['dir']) / 'c1' / 'state' / 'semantic-cache.db'}"
                         "?mode=ro", uri=True)
    (kept,) = db.execute("SELECT answer_ids FROM entries WHERE id = ?", [how["entry"]]).fetchone()
    db.close()
    tiny = load_model(default_model_path())
    encoded = tiny.encode_prompt(first["text"])
    encoded = encoded[1:] if encoded[:1] == [tiny.tokenizer.bos_token_id] else encoded
    assert kept is not None and np.frombuffer(kept, "<i4").tolist() == encoded
    assert again["token_ids"] == encoded and again["tokens"] == len(encoded)
    # the same question from another client is not served alice's answer
    assert not ask(s1, PARAPHRASE, client="bob")["cached"]
    # cache: false stays out
    assert not ask(s1, ASKED, client="alice", cache=False)["cached"]
    # the other node has its own cache: nothing of c1's
    s2 = sock(mesh, "c2")
    warm(s2)
    assert not ask(s2, PARAPHRASE, client="alice")["cached"]
    # a request may set its own bound: 0 keeps it to exact repeats
    assert not ask(s1, PARAPHRASE, client="alice", cache_max_error=0.0)["cached"]
    # the HTTP API says how: x-meshd-cache and the similarity (the testnet's client "testnet")
    url, headers = api(mesh, "c1")
    body = {"model": "tiny-en", "prompt": ASKED, "max_tokens": 12, "temperature": 0}
    before = cache_stats(s1)["inserts"]
    r = httpx.post(f"{url}/completions", json=body, timeout=60, headers=headers)
    assert r.status_code == 200 and r.headers["x-meshd-cache"] == "miss", r.text
    wait_for(lambda: cache_stats(s1)["inserts"] > before, 30, "the API answer to be stored")
    r = httpx.post(f"{url}/completions", json={**body, "prompt": PARAPHRASE}, timeout=60,
                   headers=headers)
    assert r.headers["x-meshd-cache"] == "semantic"
    assert float(r.headers["x-meshd-cache-similarity"]) == pytest.approx(how["similarity"], abs=1e-3)
    # POST /v1/embeddings answers with the node's sentence-embedding model, in OpenAI's shape
    r = httpx.post(f"{url}/embeddings", timeout=60,
                   json={"input": [ASKED, PARAPHRASE, "Who wrote the Iliad?"]}, headers=headers)
    assert r.status_code == 200, r.text
    got = r.json()
    assert got["object"] == "list" and got["model"] == "all-minilm-l6-v2"
    vecs = [d["embedding"] for d in got["data"]]
    assert [d["index"] for d in got["data"]] == [0, 1, 2] and len(vecs[0]) == 384
    dot = [sum(a * b for a, b in zip(vecs[0], v, strict=True)) for v in vecs]
    assert abs(dot[0] - 1) < 1e-4 and dot[1] > 0.9 > dot[2]  # paraphrase near, other far
    assert got["usage"]["prompt_tokens"] > 0
    bad = httpx.post(f"{url}/embeddings", json={"input": []}, timeout=30, headers=headers)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "input"
    # explain shows the hit: the journal of the request has the cache_hit event
    rid = again["request_id"]
    explained = json.loads(meshd("explain", rid, "--json", "--socket", s1).stdout)
    hit = next(e["payload"] for e in explained["events"] if e["kind"] == "cache_hit")
    assert hit["kind"] == "semantic" and hit["entry"] == how["entry"]
    assert hit["score"] > hit["threshold"]
    # ... and where the lookup's time went: the paraphrase was embedded and searched
    assert hit["embed_ms"] > 0 and hit["search_ms"] > 0
    # the search's two parts (the index with the entry's row, the verifier) and the lookup
    # thread's CPU time in the embedding and the verifier
    assert hit["index_ms"] > 0 and hit["verify_ms"] > 0
    assert hit["index_ms"] + hit["verify_ms"] <= hit["search_ms"] + 1e-3
    assert hit["embed_cpu_ms"] > 0 and hit["verify_cpu_ms"] > 0
    assert all(hit[k] >= 0 for k in ("start_ms", "queued_ms", "handoff_ms"))


def test_forwarded_to_a_peer_the_model_races_the_lookup_and_a_hit_wins(mesh: dict[str, Any]) -> None:
    """c4 serves no model: a request goes to a peer while c4 embeds the question (the request's
    machine, meshd.core.request_life, races the two). A miss streams the peer's answer; a
    paraphrase is served from c4's cache, the peer's attempt cancelled or its answer dropped."""
    s4 = sock(mesh, "c4")
    warm(s4)
    stored = cache_stats(s4)["inserts"]
    first = ask(s4, ASKED, client="carol")
    assert not first["cached"] and first["served_by"] in ("c1", "c2", "c3")
    wait_for(lambda: cache_stats(s4)["inserts"] > stored, 30, "the answer to be stored")
    again = ask(s4, PARAPHRASE, client="carol")
    assert again["cached"] is True and again["served_by"] == "c4" and again["route"] == ["c4"]
    assert again["text"] == first["text"] and again["cache"]["kind"] == "semantic"
    explained = json.loads(meshd("explain", again["request_id"], "--json", "--socket", s4).stdout)
    kinds = [e["kind"] for e in explained["events"]]
    # the forward went out beside the lookup, and the hit overtook it
    assert kinds.index("forwarded") < kinds.index("cache_overtook") < kinds.index("cache_hit")
    overtook = next(e["payload"] for e in explained["events"] if e["kind"] == "cache_overtook")
    assert overtook["model"] in ("cancelled", "dropped")


def test_a_follow_up_in_another_conversation_is_never_served_this_ones_answer(
        mesh: dict[str, Any]) -> None:
    """Chat through the HTTP API on a node whose semantic path is ready: the same follow-up
    question after other earlier turns, or with none, is a miss; the very same conversation is
    an exact hit with its own answer."""
    url, headers = api(mesh, "c2")
    s2 = sock(mesh, "c2")
    warm(s2)

    def turns(topic: str, said: str) -> list[dict[str, str]]:
        return [{"role": "user", "content": f"Tell me about {topic}."},
                {"role": "assistant", "content": said},
                {"role": "user", "content": "How do I install it?"}]

    def chat(messages: list[dict[str, str]]) -> httpx.Response:
        r = httpx.post(f"{url}/chat/completions", headers=headers, timeout=60,
                       json={"model": "tiny-en", "messages": messages, "max_tokens": 12,
                             "temperature": 0})
        assert r.status_code == 200, r.text
        return r

    def text(r: httpx.Response) -> str:
        return str(r.json()["choices"][0]["message"]["content"])

    python = turns("Python", "Python is a programming language.")
    rust = turns("Rust", "Rust is a programming language.")
    before = cache_stats(s2)["inserts"]
    first = chat(python)
    assert first.headers["x-meshd-cache"] == "miss"
    wait_for(lambda: cache_stats(s2)["inserts"] > before, 30, "the answer to be stored")
    again = chat(python)
    assert again.headers["x-meshd-cache"] == "exact" and text(again) == text(first)
    for other in (rust, python[-1:], [python[0], {"role": "assistant", "content": "A snake."},
                                      python[-1]]):
        got = chat(other)
        assert got.headers["x-meshd-cache"] == "miss", other  # another conversation: the model
        assert "x-meshd-cache-similarity" not in got.headers
    assert chat(python).headers["x-meshd-cache"] == "exact"


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

    from meshd.cache import CacheLimits, SemanticCache
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
    cache = SemanticCache(db, emb, limits=limits)
    part = cache.db.execute("SELECT partition FROM entries WHERE prompt = ?",
                            ["How tall is the Eiffel Tower?"]).fetchone()[0]  # dave's
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
    cache = SemanticCache(db, emb, limits=limits)
    cache.close()
    rows, saved = _stamps(db)
    assert saved[part] == rows[part]  # the graph of the filled partition, saved
    # the daemon again: one more answer stored, then stopped
    index = up(d, spec, advert_interval_s=1.0)
    try:
        s = index["nodes"][0]["socket"]
        warm(s)
        assert cache_stats(s)["entries"] >= EXACT_MAX + 101  # and the warm-up questions
        ask(s, "Who painted the Mona Lisa?", client="dave")
        wait_for(lambda: cache_stats(s)["inserts"] >= 1, 60, "the answer to be stored")
    finally:
        down(d)
    rows2, saved2 = _stamps(db)
    assert rows2[part] != rows[part]  # the new answer went into the filled partition
    assert saved2[part] == rows2[part]  # ... and the graph saved at the stop holds it
