"""Semantic-cache figures: decision quality on the labelled pairs, and speed and memory at
100,000 entries.

    .venv/bin/python benchmarks/bench_cache.py [--entries 100000] [--out FILE.json]
                                               [--plot docs/img/cache_pr.png]

Quality, on benchmarks/data/cache_pairs.jsonl (all-MiniLM-L6-v2 embeddings):

- *pairs*: each pair's anchor is a cached prompt, the other prompt a lookup. Fixed threshold:
  swept from 0.50 to 1.00. Adaptive: each anchor's pairs split in two halves; the entry learns
  from one half's labels (as if those lookups had been verified earlier) and is judged on the
  other, then the halves swap; ``delta`` swept. Both with and without guards. Recall = served
  share of same-answer pairs (hit rate on paraphrases); false-hit rate = served share of
  different-answer pairs; precision = right answers among served ones.
- *stream*: a real ``SemanticCache`` (SQLite in memory) sees every anchor, then every other
  prompt in a seeded random order; a lookup that is not served computes the answer (its
  label), verifies it against the candidate when the policy asked to, and inserts it.

Guards v4's verifier (``--verifier-latency``): per candidate above the default threshold that
passes the other guards, the structural checks, and where an added run is found, the word
vectors of both prompts and their alignment.

Speed and memory, on one partition of ``--entries`` entries: the anchors are real entries,
the rest are synthetic vectors (real prompt embeddings plus noise, renormalised) inserted
through SQL, then the cache is reopened twice (restart times: reading SQLite and building the
HNSW graph; then loading the graph that ``close`` saved). Lookups embed the prompt (onnxruntime default threads), search, read the row, decide;
with ``--precision fp32,int8`` every lookup is made once with each embedding graph, interleaved
(the index holds the first graph's vectors).

On a daemon (``--daemon N``): one real ``meshd run`` serving the shipped tiny-en with the cache
on, default settings but the first of ``--precision``. The anchors of the labelled pairs are asked once each; then,
interleaved: their paraphrases (cache hits: submit to DONE on the client, through the control
socket), exact repeats, new prompts with the cache on (misses) and the same sentence with
``cache: false`` (no cache step: the baseline of the miss). A miss's cost is the difference of
the client's submit-to-first-token times (the daemon's ``ttft_ms`` starts at the model and so
does not see the cache at all). With ``--daemon-entries E`` the daemon is stopped once the
anchors are cached, its cache file is filled with synthetic entries (as above, older than the
anchors) up to E entries, opened once in-process to build and save the HNSW graph, and the
daemon is started again on it before the timed requests; the daemon's RSS (``VmRSS``) is read
when it has started, when its cache is loaded and at the end.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from meshd.cache import (  # noqa: E402
    AdaptiveThreshold,
    CacheLimits,
    CacheRequest,
    FixedThreshold,
    Lookup,
    SemanticCache,
)
from meshd.cache.align import added_alignment  # noqa: E402
from meshd.cache.eviction import entry_bytes  # noqa: E402
from meshd.cache.guards import guard  # noqa: E402
from meshd.cache.keys import prompt_key  # noqa: E402
from meshd.cache.policy import qualifier  # noqa: E402
from meshd.cache.structure import added_run, roles_swapped  # noqa: E402
from meshd.embed import default_embedding_model, load_embedder  # noqa: E402
from meshd.embed.pair_verifier import PairVerifier  # noqa: E402
from meshd.embed.token_states import TokenStates  # noqa: E402

PAIRS = ROOT / "benchmarks" / "data" / "cache_pairs.jsonl"
FIXED_DEFAULT_POLICY = FixedThreshold()
FIXED_DEFAULT = FIXED_DEFAULT_POLICY.threshold
V4_GUARDS = frozenset({"roles swapped"})  # and the verifier of "qualifier added"
ADAPTIVE_DEFAULT = AdaptiveThreshold()


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class Precomputed:
    """An EmbedderLike over vectors computed beforehand (the stream evaluation)."""

    def __init__(self, vectors: dict[str, np.ndarray], identity: str) -> None:
        self.vectors, self._identity = vectors, identity

    @property
    def identity(self) -> str:
        return self._identity

    @property
    def dim(self) -> int:
        return len(next(iter(self.vectors.values())))

    def embed(self, texts: Any) -> np.ndarray:
        return np.stack([self.vectors[t] for t in texts])


def pair_rates(served: np.ndarray, same: np.ndarray) -> dict[str, float]:
    tp, fp = int(np.sum(served & same)), int(np.sum(served & ~same))
    return {"recall": tp / max(1, int(same.sum())), "false_hit_rate": fp / max(1, int((~same).sum())),
            "precision": tp / (tp + fp) if tp + fp else 1.0}


def aligner(words: dict[str, Any], query: str, cached: str) -> Any:
    """The ``align`` the cache passes to the policy, over word vectors computed beforehand."""
    return functools.partial(added_alignment, words.__getitem__, query, cached)


def adaptive_twofold(rows: list[dict[str, Any]], sims: np.ndarray, policy: AdaptiveThreshold,
                     words: dict[str, Any]) -> np.ndarray:
    groups: dict[str, list[int]] = {}
    for i, r in enumerate(rows):
        groups.setdefault(r["a"], []).append(i)
    served = np.zeros(len(rows), bool)
    for n, idx in enumerate(groups.values()):
        order = list(idx)
        np.random.default_rng(n).shuffle(order)
        halves = (order[::2], order[1::2])
        for train, test in ((halves[0], halves[1]), (halves[1], halves[0])):
            obs: tuple[tuple[float, bool], ...] = ()
            for i in train:
                obs = policy.observe(obs, float(sims[i]), bool(rows[i]["same"]))
            for i in test:
                d = policy.decide(float(sims[i]), rows[i]["b"], rows[i]["a"], obs, u=1.0,
                                  align=aligner(words, rows[i]["b"], rows[i]["a"]))
                served[i] = d.kind == "hit"
    return served


ALL_SPLITS = ("tune", "test", "fresh", "fresh2", "fresh3", "fresh4", "fresh5")


def splits(rows: list[dict[str, Any]]) -> tuple[str, ...]:
    """The splits present in the pairs, oldest first."""
    have = {r.get("split") for r in rows}
    return tuple(sp for sp in ALL_SPLITS if sp in have)


def quality_by_split(rows: list[dict[str, Any]], vec: dict[str, np.ndarray],
                     words: dict[str, Any], pair: dict[tuple[str, str], float],
                     pair_policy: FixedThreshold) -> dict[str, Any]:
    """``quality`` of each split of the pairs (benchmarks/data/README.md): ``tune`` chose the
    guards and the default threshold, ``test`` was held out from that choice (but read while
    the guards were written), ``fresh`` was written after both were frozen (guards v2),
    ``fresh2`` before guards v3 were written (a development split since guards v4), and
    ``fresh3`` before guards v4 were frozen, evaluated once after; ``fresh4`` was held out from
    the pair verifier (its training, cross-validation and defaults), evaluated once after."""
    return {sp: quality([r for r in rows if r.get("split") == sp], vec, words, pair,
                        pair_policy) for sp in splits(rows)}


def quality(rows: list[dict[str, Any]], vec: dict[str, np.ndarray], words: dict[str, Any],
            pair: dict[tuple[str, str], float] | None = None,
            pair_policy: FixedThreshold | None = None) -> dict[str, Any]:
    """Curves and default figures; ``words``: each prompt's word vectors (guards v4's
    verifier, asked only where the policy would serve); ``pair``: the pair verifier's
    probability of each (anchor, other prompt), judged with ``pair_policy``'s bound."""
    sims = np.array([float(vec[r["a"]] @ vec[r["b"]]) for r in rows])
    same = np.array([bool(r["same"]) for r in rows])
    ok = np.array([guard(r["b"], r["a"]) is None
                   and qualifier(r["b"], r["a"], aligner(words, r["b"], r["a"]),
                                 FIXED_DEFAULT_POLICY.added_word_bound) is None
                   for r in rows])
    out: dict[str, Any] = {"pairs": len(rows), "same": int(same.sum()),
                           "different": int((~same).sum()), "curves": {}}
    for guards in (False, True):
        gate = ok if guards else np.ones_like(ok)
        out["curves"][f"fixed{'+guards' if guards else ''}"] = [
            {"threshold": round(float(t), 3), **pair_rates((sims >= t) & gate, same)}
            for t in np.linspace(0.5, 1.0, 101)]
        out["curves"][f"adaptive{'+guards' if guards else ''}"] = [
            {"delta": d, **pair_rates(adaptive_twofold(
                rows, sims, replace(ADAPTIVE_DEFAULT, delta=d, guards=guards), words), same)}
            for d in (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5)]
    if pair is not None and pair_policy is not None:
        pp = np.array([pair[(r["a"], r["b"])] for r in rows])
        guarded = np.array([guard(r["b"], r["a"]) is None for r in rows])
        # the policy's own setting: a verifier whose defaults were chosen without the guards
        # (pair-verifier-v2) is asked with none in front
        gate = guarded if pair_policy.guards else np.ones_like(guarded)
        passes = pp >= pair_policy.pair_min_p
        out["curves"]["fixed+pair"] = [
            {"threshold": round(float(t), 3), **pair_rates((sims >= t) & gate & passes, same)}
            for t in np.linspace(0.5, 1.0, 101)]
        out["pair_defaults"] = {
            "pair": {"threshold": pair_policy.threshold, "min_p": pair_policy.pair_min_p,
                     **pair_rates((sims >= pair_policy.threshold) & gate & passes, same)},
            "pair_no_guards": pair_rates((sims >= pair_policy.threshold) & passes, same),
            "pair_with_guards": pair_rates((sims >= pair_policy.threshold) & guarded & passes, same),
            "pair_candidates": float(np.mean((sims >= pair_policy.threshold) & gate)),
        }
    out["defaults"] = {
        "fixed": {"threshold": FIXED_DEFAULT, **pair_rates((sims >= FIXED_DEFAULT) & ok, same)},
        "fixed_no_guards": pair_rates(sims >= FIXED_DEFAULT, same),
        "adaptive": {"delta": ADAPTIVE_DEFAULT.delta,
                     **pair_rates(adaptive_twofold(rows, sims, ADAPTIVE_DEFAULT, words), same)},
        "fixed_guards_v3": {"threshold": FIXED_DEFAULT, **pair_rates(
            (sims >= FIXED_DEFAULT) & np.array([guard(r["b"], r["a"], skip=V4_GUARDS) is None
                                                for r in rows]), same)},
    }
    kinds: dict[str, list[float]] = {}
    for r, s in zip(rows, sims, strict=True):
        kinds.setdefault(r["kind"], []).append(float(s))
    out["similarity_by_kind_p5_p50_p95"] = {k: [round(float(np.percentile(v, q)), 3)
                                                for q in (5, 50, 95)] for k, v in kinds.items()}
    return out


def stream(rows: list[dict[str, Any]], vec: dict[str, np.ndarray], policy: Any, seed: int = 0,
           words: dict[str, Any] | None = None, pair: Any = None) -> dict[str, float]:
    cache = SemanticCache(":memory:", Precomputed(vec, "bench"), policy=policy,
                          rng=np.random.default_rng(seed).random,
                          word_states=words.__getitem__ if words is not None else None,
                          pair_verifier=pair)
    truth: dict[str, str] = {}
    for r in rows:
        truth.setdefault(r["a"], r["answer_a"])
    events = [(a, None) for a in truth]
    tail = list(range(len(rows)))
    np.random.default_rng(seed).shuffle(tail)
    events += [(rows[i]["b"], i) for i in tail]
    req = CacheRequest(model="bench", tenant="t", client="c", prompt="")
    n = {"para": 0, "para_hit": 0, "near": 0, "near_wrong": 0, "hits": 0, "wrong": 0,
         "verifies": 0}
    answers: dict[int, str] = {}
    for text, i in events:
        want = truth[text] if i is None else rows[i]["answer_b"]
        q = replace(req, prompt=text)
        got = cache.lookup(q, vector=vec[text])
        if got.kind == "hit":
            served = answers[got.entry_id or 0]
            n["hits"] += 1
            n["wrong"] += served != want
        else:
            if got.kind == "verify":
                n["verifies"] += 1
                cache.observe(got.entry_id or 0, got.similarity or 0.0,
                              answers[got.entry_id or 0] == want)
            eid = cache.insert(q, want, lookup=got)
            answers[eid or 0] = want
            served = None
        if i is not None and rows[i]["same"]:
            n["para"] += 1
            n["para_hit"] += served == want
        elif i is not None:
            n["near"] += 1
            n["near_wrong"] += served is not None and served != want
    return {"lookups": len(events), "paraphrase_hit_rate": n["para_hit"] / n["para"],
            "near_miss_false_hit_rate": n["near_wrong"] / n["near"],
            "wrong_share_of_hits": n["wrong"] / max(1, n["hits"]), "hits": n["hits"],
            "verifies": n["verifies"]}


def plot(qs: dict[str, Any], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [sp for sp in reversed(ALL_SPLITS) if sp in qs][:3]  # the newest three
    fig, axes = plt.subplots(len(shown), 2, figsize=(11, 4.5 * len(shown)), squeeze=False)
    for (ax1, ax2), sp in zip(axes, shown, strict=True):
        _plot_split(qs[sp], sp, ax1, ax2)
    fig.suptitle("semantic cache, all-MiniLM-L6-v2; fixed+guards: guards v4 and their verifier; "
                 "fixed+pair: the guards and the pair verifier at its min_p,\nswept over the "
                 "cosine threshold; circles: defaults (green: the pair verifier's, 0.79); "
                 "splits named in docs/cache.md")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)


def _plot_split(q: dict[str, Any], split: str, ax1: Any, ax2: Any) -> None:
    styles = {"fixed": ("tab:blue", "--"), "fixed+guards": ("tab:blue", "-"),
              "fixed+pair": ("tab:green", "-"),
              "adaptive": ("tab:orange", "--"), "adaptive+guards": ("tab:orange", "-")}
    for name, pts in q["curves"].items():
        color, ls = styles[name]
        r = [p["recall"] for p in pts]
        ax1.plot(r, [p["precision"] for p in pts], ls, color=color, label=name, marker=".")
        ax2.plot([p["false_hit_rate"] for p in pts], r, ls, color=color, label=name, marker=".")
    for key, color in (("fixed", "tab:blue"), ("adaptive", "tab:orange")):
        d = q["defaults"][key]
        ax1.plot(d["recall"], d["precision"], "o", color=color, ms=10, mfc="none")
        ax2.plot(d["false_hit_rate"], d["recall"], "o", color=color, ms=10, mfc="none")
    if "pair_defaults" in q:
        d = q["pair_defaults"]["pair"]
        ax1.plot(d["recall"], d["precision"], "o", color="tab:green", ms=10, mfc="none")
        ax2.plot(d["false_hit_rate"], d["recall"], "o", color="tab:green", ms=10, mfc="none")
    ax2.axvline(0.01, color="grey", lw=0.8)
    ax2.axhline(0.60, color="grey", lw=0.8)
    ax1.set(xlabel="recall (hit rate on same-answer pairs)", ylabel="precision",
            title=f"{split}: {q['pairs']} pairs, precision / recall", xlim=(0, 1),
            ylim=(0.4, 1.01))
    ax2.set(xlabel="false-hit rate (different-answer pairs served)",
            ylabel="hit rate on same-answer pairs",
            title=f"{split}: goal <= 1% false, >= 60% hits", xlim=(0, 1))
    ax2.set_xscale("symlog", linthresh=0.01)
    ax1.legend(loc="lower left")


def add_synthetic(cache: SemanticCache, part: str, base: np.ndarray, n: int, *, now: float,
                  last_used: float, seed: int = 0) -> None:
    """Insert ``n`` synthetic rows into partition ``part`` through SQL, in the cache's own
    format: real prompt vectors (``base``) plus noise (cosine ~0.7 to their source),
    renormalised, and 300-byte answers. The open cache does not see them: reopen it."""
    rng = np.random.default_rng(seed)
    batch = []
    for i in range(n):
        v = base[i % len(base)] + 0.045 * rng.standard_normal(base.shape[1])
        v = (v / np.linalg.norm(v)).astype(np.float32)
        prompt, answer = f"synthetic prompt {i}", f"synthetic answer {i} " + "x" * 300
        batch.append((part, prompt_key(prompt), prompt, answer, v.tobytes(), now, last_used,
                      now + 86400, 0, entry_bytes(prompt, answer, base.shape[1]), "[]"))
    with cache.db.conn:
        cache.db.conn.executemany(
            "INSERT INTO entries (partition, prompt_key, prompt, answer, vector, created_at, "
            "last_used, expires_at, hits, nbytes, observations) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
            batch)


def speed(embs: dict[str, Any], rows: list[dict[str, Any]], vec: dict[str, np.ndarray],
          entries: int, root: Path) -> dict[str, Any]:
    emb = next(iter(embs.values()))
    req = CacheRequest(model="bench", tenant="t", client="c", prompt="")
    path = root / "cache.db"
    anchors = sorted({r["a"] for r in rows})
    cache = SemanticCache(path, emb, policy=FixedThreshold(),
                          limits=CacheLimits(max_entries=entries + 1000, max_bytes=2**40))
    t0 = time.perf_counter()
    for a in anchors:
        cache.insert(replace(req, prompt=a), f"answer to {a}", lookup=None)
    base = np.stack(list(vec.values()))
    part = cache.db.execute("SELECT partition FROM entries LIMIT 1").fetchone()[0]
    now = time.time()
    t1 = time.perf_counter()
    add_synthetic(cache, part, base, entries - len(anchors), now=now, last_used=now)
    sql_s = time.perf_counter() - t1
    cache.close()
    rss0 = rss_bytes()
    t2 = time.perf_counter()
    cache = SemanticCache(path, emb, policy=FixedThreshold(),
                          limits=CacheLimits(max_entries=entries + 1000, max_bytes=2**40))
    open_s = time.perf_counter() - t2
    rss1 = rss_bytes()
    cache.close()  # saves the HNSW graph: the next open loads it instead of rebuilding
    t2 = time.perf_counter()
    cache = SemanticCache(path, emb, policy=FixedThreshold(),
                          limits=CacheLimits(max_entries=entries + 1000, max_bytes=2**40))
    open_saved_s = time.perf_counter() - t2
    st = cache.statistics()
    # Inserts through the API into the full cache (SQLite row + index add + bound checks).
    t3 = time.perf_counter()
    probe = [replace(req, prompt=f"new prompt {i}") for i in range(300)]
    for i, p in enumerate(probe):
        cache.insert(p, "a new answer", lookup=Lookup("miss", "", vector=base[i % len(base)]))
    insert_s = time.perf_counter() - t3
    # Lookups: anchors' paraphrases (hits at the default) and other prompts, once with each
    # embedding graph, interleaved.
    timed: dict[str, dict[str, list[float]]] = {
        p: {"hit": [], "miss": [], "search": [], "embed": [], "cpu": []} for p in embs}
    texts = [r["b"] for r in rows][:400]
    for text in texts:
        for prec, e in embs.items():
            cache.embedder = e
            t, c = time.perf_counter(), time.process_time()
            got = cache.lookup(replace(req, prompt=text))
            dt = (time.perf_counter() - t) * 1e3
            tm = timed[prec]
            tm["hit" if got.kind == "hit" else "miss"].append(dt)
            tm["cpu"].append((time.process_time() - c) * 1e3)
            tm["search"].append(got.search_ms)
            tm["embed"].append(got.embed_ms)
    cache.embedder = emb
    # Exact repeats of cached prompts: answered from SQLite without embedding.
    repeat_ms = []
    for a in anchors[:90]:
        t = time.perf_counter()
        got = cache.lookup(replace(req, prompt=a))
        repeat_ms.append((time.perf_counter() - t) * 1e3)
        assert got.kind == "hit" and got.reason == "same prompt"
    # The same lookups with the vector given: what the index and SQLite cost alone.
    alone = []
    for text in texts:
        v = vec[text]
        t = time.perf_counter()
        cache.lookup(replace(req, prompt=text), vector=v)
        alone.append((time.perf_counter() - t) * 1e3)

    def p(xs: list[float], q: float) -> float:
        return round(float(np.percentile(xs, q)), 3) if xs else float("nan")

    by_precision = {prec: {
        "lookup_hit_end_to_end_ms": {"n": len(tm["hit"]), "p50": p(tm["hit"], 50),
                                     "p99": p(tm["hit"], 99)},
        "lookup_miss_end_to_end_ms": {"n": len(tm["miss"]), "p50": p(tm["miss"], 50),
                                      "p99": p(tm["miss"], 99)},
        "lookup_cpu_ms_p50": p(tm["cpu"], 50),
        "embed_ms": {"p50": p(tm["embed"], 50), "p99": p(tm["embed"], 99)},
        "search_and_decide_ms": {"p50": p(tm["search"], 50), "p99": p(tm["search"], 99)},
    } for prec, tm in timed.items()}
    return {
        "entries": st["entries"], "index": st["index_kinds"], "lookups": by_precision,
        "index_bytes": st["index_bytes"], "sqlite_file_bytes": path.stat().st_size,
        "rss_of_open_cache_bytes": rss1 - rss0, "restart_rebuilding_index_s": round(open_s, 2),
        "restart_loading_saved_index_s": round(open_saved_s, 2),
        "sql_bulk_insert_s": round(sql_s, 2), "first_real_inserts_s": round(t1 - t0, 2),
        "api_inserts_per_s_at_full_size": round(len(probe) / insert_s, 1),
        "exact_repeat_hit_ms": {"n": len(repeat_ms), "p50": p(repeat_ms, 50),
                                "p99": p(repeat_ms, 99)},
        "lookup_with_vector_given_ms": {"p50": p(alone, 50), "p99": p(alone, 99)},
    }


def verifier_latency(rows: list[dict[str, Any]], vec: dict[str, np.ndarray],
                     states: TokenStates, repeats: int = 3) -> dict[str, Any]:
    """What guards v4 add to a candidate above the threshold, per candidate: the two
    structural checks (``roles_swapped``, ``added_run``: pure string work, every candidate),
    and, where ``added_run`` finds an added run, the encoder's word vectors of both prompts
    (two runs of the token-state session, nothing memoised) and their alignment."""
    cands = [r for r in rows if float(vec[r["a"]] @ vec[r["b"]]) >= FIXED_DEFAULT
             and guard(r["b"], r["a"], skip=V4_GUARDS) is None]
    structural, fired = [], []
    for _ in range(repeats):
        for r in cands:
            q, c = r["b"], r["a"]
            t = time.perf_counter()
            roles_swapped(q + " ", c + " ")  # a new string: the lexical caches miss
            added = added_run(q + " ", c + " ")
            structural.append((time.perf_counter() - t) * 1e6)
            if added is not None:
                states._memo.clear()
                t = time.perf_counter()
                added_alignment(states.words, q + " ", c + " ", added)
                fired.append((time.perf_counter() - t) * 1e6)

    def p(xs: list[float], q: float) -> float:
        return round(float(np.percentile(xs, q)), 1) if xs else float("nan")

    return {"candidates": len(cands), "fired_share": round(len(fired) / max(1, len(structural)), 3),
            "structural_us": {"n": len(structural), "p50": p(structural, 50),
                              "p90": p(structural, 90)},
            "alignment_when_fired_us": {"n": len(fired), "p50": p(fired, 50), "p90": p(fired, 90)},
            "threads": 1}


def pair_latency(rows: list[dict[str, Any]], vec: dict[str, np.ndarray], pv: PairVerifier,
                 policy: FixedThreshold, repeats: int = 3) -> dict[str, Any]:
    """What the pair verifier adds to a candidate it is asked about (similarity at or above
    the policy's threshold, no guard refusing), per candidate: tokenizing the pair, the
    embedding sum and one run of its graph (one thread), nothing memoised; and its RSS."""
    cands = [r for r in rows if float(vec[r["a"]] @ vec[r["b"]]) >= policy.threshold
             and guard(r["b"], r["a"]) is None]
    ms, tokens = [], []
    for _ in range(repeats):
        for r in cands:
            t = time.perf_counter()
            pv.probability(r["a"], r["b"])
            ms.append((time.perf_counter() - t) * 1e3)
    for r in cands:
        tokens.append(len(pv._tok.encode(r["a"], r["b"]).ids))
    rss0 = rss_bytes()
    extra = PairVerifier(None, pv.embed_dir)  # a second one: what loading one costs
    extra.probability("warm", "up")
    rss1 = rss_bytes()

    def p(xs: list[float], q: float) -> float:
        return round(float(np.percentile(xs, q)), 2) if xs else float("nan")

    return {"candidates": len(cands), "share_of_pairs": round(len(cands) / max(1, len(rows)), 3),
            "ms": {"n": len(ms), "p50": p(ms, 50), "p90": p(ms, 90), "p99": p(ms, 99)},
            "tokens_p50": p([float(x) for x in tokens], 50), "threads": 1,
            "load_rss_mib": round((rss1 - rss0) / 2**20, 1)}


def pid_rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def fill_daemon_cache(path: Path, emb: Any, vec: dict[str, np.ndarray], total: int
                      ) -> dict[str, Any]:
    """With the daemon stopped: add synthetic rows to its cache file (the partition its anchors
    went to) until it holds ``total`` entries, older than the anchors (so that eviction takes
    them first), then open it once to build the HNSW graph and close it to save the graph, as
    the daemon's own shutdown would; the daemon loads that graph when it starts."""
    limits = CacheLimits(max_entries=total + 1000, max_bytes=2**40)
    cache = SemanticCache(path, emb, policy=FixedThreshold(), limits=limits)
    parts = cache.db.execute("SELECT partition, count(*) FROM entries GROUP BY partition "
                             "ORDER BY count(*) DESC").fetchall()
    part, have = parts[0][0], sum(r[1] for r in parts)
    now = time.time()
    t0 = time.perf_counter()
    add_synthetic(cache, part, np.stack(list(vec.values())), total - have, now=now,
                  last_used=now - 3600)
    sql_s = time.perf_counter() - t0
    cache.close()
    t1 = time.perf_counter()
    cache = SemanticCache(path, emb, policy=FixedThreshold(), limits=limits)
    build_s = time.perf_counter() - t1
    st = cache.statistics()
    cache.close()
    return {"entries": st["entries"], "index": st["index_kinds"], "sql_insert_s": round(sql_s, 1),
            "graph_build_s": round(build_s, 1), "sqlite_file_bytes": path.stat().st_size}


def daemon_e2e(rows: list[dict[str, Any]], root: Path, n: int, precision: str, *,
               fill: int = 0, emb: Any = None, vec: dict[str, np.ndarray] | None = None
               ) -> dict[str, Any]:
    import trio

    from meshd.testing.wait import wait_for
    from meshd.testnet.drive import cli, stream
    from meshd.testnet.launcher import NodeSpec, down, up

    spec = NodeSpec(name="c1", extra={"cache": {"enabled": True, "embed_precision": precision}})
    index = up(root / "net", [spec], advert_interval_s=1.0)
    sock = index["nodes"][0]["socket"]
    memory: dict[str, Any] = {}

    def stats() -> dict[str, Any]:
        return dict(json.loads(cli("cache", "stats", "--json", "--socket", sock).stdout))

    first: list[float] = []
    sent_ms: list[float] = []  # from the SUBMIT frame leaving on the open connection to DONE

    def ask(prompt: str, **extra: Any) -> tuple[dict[str, Any], float]:
        """(DONE stats, submit to DONE ms); ``first[-1]``: submit to the first tokens, ms, both
        on the client."""
        fields = {"prompt": prompt, "max_tokens": 1, "temperature": 0.0,
                  "client": "bench", **extra}
        t = time.monotonic()
        got = trio.run(stream, sock, fields, lambda _: first.append((time.monotonic() - t) * 1e3))
        sent_ms.append((got["done_at"] - got["sent_at"]) * 1e3)
        return got["stats"], (got["done_at"] - t) * 1e3

    try:
        ask("Warm up.", client="warmup")
        wait_for(lambda: stats()["state"] == "ready", 300, "the semantic cache to load")
        anchors = sorted({r["a"] for r in rows})
        for a in anchors:
            ask(a)
        wait_for(lambda: stats()["inserts"] >= len(anchors), 300, "the anchors to be stored")
        if fill:
            down(root / "net")
            memory["fill"] = fill_daemon_cache(root / "net" / "c1" / "state" / "semantic-cache.db",
                                               emb, vec or {}, fill)
            index = up(root / "net", [spec], advert_interval_s=1.0)
            sock, pid = index["nodes"][0]["socket"], index["nodes"][0]["pid"]
            memory["rss_started_bytes"] = pid_rss_bytes(pid)
            ask("Warm up.", client="warmup")
            t0 = time.perf_counter()
            wait_for(lambda: stats()["state"] == "ready", 600, "the semantic cache to load")
            memory["cache_load_s"] = round(time.perf_counter() - t0, 1)
            memory["rss_cache_ready_bytes"] = pid_rss_bytes(pid)
            for a in anchors:  # warm the hit path (and check the anchors are still there)
                ask(a)
        paraphrases = [r["b"] for r in rows if r["same"]]
        hit_ms, hit_ttft, miss_ttft, off_ttft, repeat_ms, repeat_ttft = [], [], [], [], [], []
        miss_first, off_first = [], []
        hit_sent: list[float] = []
        repeat_sent: list[float] = []
        missed = 0
        for i in range(n):
            st, ms = ask(paraphrases[i % len(paraphrases)])
            if st.get("cached"):
                hit_ms.append(ms)
                hit_sent.append(sent_ms[-1])
                hit_ttft.append(float(st["ttft_ms"]))
            else:
                missed += 1
            st, ms = ask(anchors[i % len(anchors)])
            if st.get("cached"):
                repeat_ms.append(ms)
                repeat_sent.append(sent_ms[-1])
                repeat_ttft.append(float(st["ttft_ms"]))
            # the same sentence with other numbers: a miss (the numbers guard) of equal length
            st, _ = ask(f"Tell me something new about topic number {i} and its history.")
            miss_ttft.append(float(st["ttft_ms"]))
            miss_first.append(first[-1])
            st, _ = ask(f"Tell me something new about topic number {i + 50_000} and its "
                        "history.", cache=False)
            off_ttft.append(float(st["ttft_ms"]))
            off_first.append(first[-1])
        final = stats()
        if fill:
            memory["rss_end_bytes"] = pid_rss_bytes(index["nodes"][0]["pid"])
    finally:
        down(root / "net")

    def p(xs: list[float], q: float) -> float:
        return round(float(np.percentile(xs, q)), 2) if xs else float("nan")

    return {
        **memory,
        "hit_submit_to_done_ms": {"n": len(hit_ms), "p50": p(hit_ms, 50), "p95": p(hit_ms, 95),
                                  "p99": p(hit_ms, 99)},
        "hit_daemon_ttft_ms": {"p50": p(hit_ttft, 50), "p95": p(hit_ttft, 95),
                               "p99": p(hit_ttft, 99)},
        # the same requests timed from the SUBMIT frame leaving an open connection (no event
        # loop start, connect or HELLO: what a client that keeps its connection sees)
        "hit_sent_to_done_ms": {"p50": p(hit_sent, 50), "p95": p(hit_sent, 95),
                                "p99": p(hit_sent, 99)},
        "exact_repeat_sent_to_done_ms": {"p50": p(repeat_sent, 50), "p99": p(repeat_sent, 99)},
        "paraphrases_not_served": missed,
        "exact_repeat_submit_to_done_ms": {"n": len(repeat_ms), "p50": p(repeat_ms, 50),
                                           "p99": p(repeat_ms, 99)},
        "exact_repeat_daemon_ttft_ms": {"p50": p(repeat_ttft, 50), "p99": p(repeat_ttft, 99)},
        "miss_daemon_ttft_ms": {"n": len(miss_ttft), "p50": p(miss_ttft, 50),
                                "p99": p(miss_ttft, 99)},
        "cache_false_daemon_ttft_ms": {"n": len(off_ttft), "p50": p(off_ttft, 50),
                                       "p99": p(off_ttft, 99)},
        "miss_client_first_token_ms": {"p50": p(miss_first, 50), "p99": p(miss_first, 99)},
        "cache_false_client_first_token_ms": {"p50": p(off_first, 50), "p99": p(off_first, 99)},
        "miss_adds_p50_ms": round(p(miss_first, 50) - p(off_first, 50), 2),
        "miss_adds_p50_ms_paired": round(float(np.median(np.array(miss_first)
                                                         - np.array(off_first))), 2),
        "cache": {k: final.get(k) for k in ("state", "entries", "hits", "misses", "inserts")},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--entries", type=int, default=100_000)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--plot", type=Path, default=ROOT / "docs" / "img" / "cache_pr.png")
    ap.add_argument("--skip-speed", action="store_true")
    ap.add_argument("--splits", default="",
                    help="only these splits of the labelled pairs, comma separated (default: all)")
    ap.add_argument("--pair-verifier", type=Path, default=None, metavar="NPZ",
                    help="the pair verifier's weights (default: the one shipped with meshd)")
    ap.add_argument("--model", type=Path, default=None, metavar="DIR",
                    help="an imported embedding model directory (default: import into a "
                    "temporary cache)")
    ap.add_argument("--verifier-latency", action="store_true",
                    help="time guards v4 per candidate above the threshold (structural checks; "
                         "word vectors and alignment where a run was added)")
    ap.add_argument("--skip-quality", action="store_true",
                    help="skip the labelled-pairs curves, the stream and the plot")
    ap.add_argument("--precision", default="int8,fp32",
                    help="embedding graphs to time lookups with, comma separated (the first "
                         "also gives the quality figures and the index's vectors)")
    ap.add_argument("--daemon", type=int, default=0, metavar="N",
                    help="also time N hits, repeats and misses on a real daemon")
    ap.add_argument("--daemon-entries", type=int, default=0, metavar="E",
                    help="with --daemon: after the anchors are cached, stop the daemon, fill its "
                         "cache file with synthetic entries up to E in all (the cache's own SQLite "
                         "format, HNSW graph saved as at shutdown), and start it again")
    args = ap.parse_args()
    rows = [json.loads(line) for line in PAIRS.read_text().splitlines() if line.strip()]
    if args.splits:
        rows = [r for r in rows if r.get("split") in args.splits.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model or default_embedding_model(cache_dir=Path(tmp))
        precisions = args.precision.split(",")
        embs = {p: load_embedder(model_dir, precision=p) for p in precisions}
        emb = embs[precisions[0]]
        texts = sorted({r["a"] for r in rows} | {r["b"] for r in rows})
        t0 = time.perf_counter()
        vec = dict(zip(texts, emb.embed(texts), strict=True))
        result: dict[str, Any] = {"embed_pairs_s": round(time.perf_counter() - t0, 1),
                                  "loadavg_1min_start": os.getloadavg()[0]}
        states = TokenStates(model_dir, precision=precisions[0])
        t0 = time.perf_counter()
        words = {t: states.words(t) for t in texts}
        result["word_states_s"] = round(time.perf_counter() - t0, 1)
        pv = PairVerifier(args.pair_verifier, model_dir)
        pair_policy = FixedThreshold(threshold=pv.info.threshold, pair_min_p=pv.info.min_p,
                                     guards=pv.info.guards)
        t0 = time.perf_counter()
        pair = {(r["a"], r["b"]): pv.probability(r["a"], r["b"]) for r in rows}
        result["pair_verifier_s"] = round(time.perf_counter() - t0, 1)
        memo = functools.lru_cache(maxsize=None)(pv.probability)
        q = (quality_by_split(rows, vec, words, pair, pair_policy)
             if not args.skip_quality else {})
        result["quality"] = q
        result["stream"] = {} if args.skip_quality else {sp: {
            "pair": stream(part, vec, pair_policy, pair=memo),
            "fixed": stream(part, vec, FixedThreshold(), words=words),
            "fixed_no_verifier": stream(part, vec, FixedThreshold()),
            "fixed_no_guards": stream(part, vec, FixedThreshold(guards=False)),
            "adaptive": stream(part, vec, AdaptiveThreshold(), words=words),
            "adaptive_no_guards": stream(part, vec, AdaptiveThreshold(guards=False)),
        } for sp in splits(rows) if (part := [r for r in rows if r["split"] == sp])}
        if not args.skip_quality:
            plot(q, args.plot)
        if args.verifier_latency:
            result["verifier"] = verifier_latency(rows, vec, states)
            result["pair_verifier"] = pair_latency(rows, vec, pv, pair_policy)
        if not args.skip_speed:
            result["speed"] = speed(embs, rows, vec, args.entries, Path(tmp))
        if args.daemon:
            result["daemon"] = daemon_e2e(rows, Path(tmp), args.daemon, precisions[0],
                                          fill=args.daemon_entries, emb=emb, vec=vec)
        result["loadavg_1min_end"] = os.getloadavg()[0]
    summary = {k: v for k, v in result.items() if k != "quality"}
    summary["defaults"] = {sp: {**qs.get("pair_defaults", {}), **qs["defaults"]}
                           for sp, qs in q.items()}
    print(json.dumps(summary, indent=1))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
