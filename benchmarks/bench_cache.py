"""Answer-cache figures: how well the semantic path decides on the labelled pairs, what each part
of the decision adds, and speed and memory at 100,000 entries.

    .venv/bin/python benchmarks/bench_cache.py --quality [--plot docs/img/cache_bound.png]
    .venv/bin/python benchmarks/bench_cache.py --ablation a52c731
    .venv/bin/python benchmarks/bench_cache.py --speed [--entries 100000]
    .venv/bin/python benchmarks/bench_cache.py --daemon 300 --daemon-entries 100000

Every pair of benchmarks/data/cache_pairs*.jsonl (benchmarks/data/README.md) is scored once:
the cosine of the two prompts' int8 embeddings (the daemon's default graph) and the pair
verifier's score of (anchor, other prompt), as the daemon asks it; ``--scores FILE`` keeps them
between runs. Splits: ``calibration`` (train3a-c, train4a-b: the calibration the threshold comes
from), ``held-out`` (fresh4, fresh5, fresh6: never used to choose or fit anything), and the rest
(development: the verifier was trained on them). *Served* is the share of paraphrases
answered from the cache; *false hits* the share of near misses answered (with another
question's answer).

- ``--quality``: at the default bound (``[cache] max_error = 0.01``) and along the bound
  (0.001 to 0.2), per split, per kind and per ``how`` of near miss, the pairs (the anchor cached,
  the other prompt looked up) and a *stream* (a real ``SemanticCache``, SQLite in memory, gets
  every anchor, then every other prompt in a seeded order, storing what it had to compute, so
  a near miss may also meet another cached prompt); ``--plot`` draws served share against
  false hits and precision.
- ``--ablation REV``: each part of the decision and each lexical rule that meshd had at git
  revision ``REV`` (guards v1-v4 and the per-entry adaptive thresholds, read from that commit,
  not from this tree), each calibrated the same way (the threshold on the calibration splits at
  a 1% bound), and what it does to served share and false hits on the held-out splits.
- ``--speed``: on one partition of ``--entries`` entries (the anchors as real entries, the
  rest synthetic vectors inserted through SQL), exact and semantic lookups in-process, restart
  times, memory.
- ``--daemon N``: one real ``meshd run`` serving the shipped tiny-en with the cache on
  (defaults): the anchors of ``--splits`` are asked once each; with ``--daemon-entries E`` the
  daemon is then stopped, its cache file filled with synthetic entries up to E (HNSW graph
  saved as at shutdown) and started again; then, interleaved, N times: a paraphrase (a
  semantic hit when served), an exact repeat of an anchor (answers of 32 tokens), a new prompt
  (a miss) and the same with ``cache: false`` (first token); submit to DONE on the client,
  through the control socket; and, read from each semantic hit's journal afterwards (not
  timed), where its lookup spent its time (``semantic_hit_phases_ms_p50``: wall and the
  lookup thread's CPU time per phase, docs/cache.md "Where a hit's time goes").
- ``--verifier-ab N``: N pairs of ``--splits`` scored by the pair verifier as the daemon runs
  it, without and with its spinning twin, interleaved in one process: wall and process CPU
  time, how often the twin spun, and how many scores differ (must be 0).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from meshd.cache import CacheLimits, CacheRequest, Calibration, SemanticCache  # noqa: E402
from meshd.cache.bound import threshold  # noqa: E402
from meshd.cache.eviction import entry_bytes  # noqa: E402
from meshd.cache.keys import prompt_key  # noqa: E402
from meshd.embed import default_embedding_model, load_embedder  # noqa: E402
from meshd.embed.pair_verifier import PairVerifier, read_calibration  # noqa: E402

DATA = ROOT / "benchmarks" / "data"
PAIRS = DATA / "cache_pairs.jsonl"
CALIBRATION = ("train3a", "train3b", "train3c", "train4a", "train4b")
HELD_OUT = ("fresh4", "fresh5", "fresh6")
DEVELOPMENT = ("tune", "test", "fresh", "fresh2", "fresh3", "train2")
DEFAULT = 0.01
ANSWER_TOKENS = 32  # the daemon benchmark's answers (greedy)
BOUNDS = (0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15,
          0.2)


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def load_pairs() -> list[dict[str, Any]]:
    rows = []
    for path in [PAIRS, *sorted(DATA.glob("cache_pairs_*.jsonl"))]:
        rows += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return rows


def score_pairs(rows: list[dict[str, Any]], model_dir: Path, cache: Path | None
                ) -> tuple[dict[str, np.ndarray], list[dict[str, Any]]]:
    """(each prompt's int8 vector, the rows with ``cos`` and ``p``), from ``cache`` if it
    holds them."""
    emb = load_embedder(model_dir, precision="int8")
    texts = sorted({r["a"] for r in rows} | {r["b"] for r in rows})
    vec: dict[str, np.ndarray] = {}
    for i in range(0, len(texts), 64):
        vec.update(zip(texts[i:i + 64], emb.embed(texts[i:i + 64]), strict=True))
    got: dict[tuple[str, str], float] = {}
    if cache is not None and cache.exists():
        got = {(r["a"], r["b"]): r["p"] for r in map(json.loads, cache.read_text().splitlines())}
    if not all((r["a"], r["b"]) in got for r in rows):
        pv = PairVerifier(None, model_dir, threads=1)
        for r in rows:
            if (r["a"], r["b"]) not in got:
                got[(r["a"], r["b"])] = pv.probability(r["a"], r["b"])
    out = [{**r, "cos": float(vec[r["a"]] @ vec[r["b"]]), "p": got[(r["a"], r["b"])]}
           for r in rows]
    if cache is not None:
        cache.write_text("".join(json.dumps({"a": r["a"], "b": r["b"], "p": r["p"]}) + "\n"
                                 for r in out))
    return vec, out


def pair_rates(served: np.ndarray, same: np.ndarray) -> dict[str, float]:
    tp, fp = int(np.sum(served & same)), int(np.sum(served & ~same))
    return {"recall": tp / max(1, int(same.sum())), "false_hit_rate": fp / max(1, int((~same).sum())),
            "precision": tp / (tp + fp) if tp + fp else 1.0}


def rates(rows: list[dict[str, Any]], served: list[bool]) -> dict[str, Any]:
    pos = [s for s, r in zip(served, rows, strict=True) if r["same"]]
    neg = [s for s, r in zip(served, rows, strict=True) if not r["same"]]
    tp, fp = sum(pos), sum(neg)
    return {"served": round(tp / max(1, len(pos)), 4), "false": round(fp / max(1, len(neg)), 4),
            "false_n": fp, "near_misses": len(neg), "paraphrases": len(pos),
            "precision": round(tp / (tp + fp), 4) if tp + fp else 1.0}


Rule = Callable[[dict[str, Any]], bool]  # served at the calibrated threshold?


def calibrated(rows: list[dict[str, Any]], score: Callable[[dict[str, Any]], float],
               gate: Callable[[dict[str, Any]], bool], max_error: float = DEFAULT
               ) -> tuple[float | None, Rule]:
    """The threshold on ``score`` that the calibration splits give at ``max_error`` (their
    near misses that pass ``gate`` scored, the others counted), and the rule it makes."""
    near = [r for r in rows if r["split"] in CALIBRATION and not r["same"]]
    scores = tuple(sorted((score(r) for r in near if gate(r)), reverse=True))
    t = threshold(Calibration(0.0, len(near), scores), max_error)
    return t, lambda r: t is not None and gate(r) and score(r) > t


def by_split(rows: list[dict[str, Any]], rule: Rule) -> dict[str, Any]:
    out = {}
    for sp in (*CALIBRATION, *HELD_OUT, *DEVELOPMENT):
        part = [r for r in rows if r["split"] == sp]
        out[sp] = rates(part, [rule(r) for r in part])
    held = [r for r in rows if r["split"] in HELD_OUT]
    out["held_out"] = rates(held, [rule(r) for r in held])
    return out


def by_kind(rows: list[dict[str, Any]], rule: Rule, splits: tuple[str, ...]) -> dict[str, Any]:
    """Near misses served, per ``kind`` and per ``how`` (hand-written splits say how each near
    miss was made)."""
    out: dict[str, list[int]] = {}
    for r in rows:
        if r["split"] in splits and not r["same"]:
            for key in (f"kind:{r['kind']}", f"how:{r.get('how', '-')}"):
                n = out.setdefault(key, [0, 0])
                n[0] += rule(r)
                n[1] += 1
    return {k: {"served": v[0], "of": v[1], "rate": round(v[0] / v[1], 4)}
            for k, v in sorted(out.items())}


# -- the default, along the bound, and the stream --------------------------------------------


def default_rule(rows: list[dict[str, Any]], max_error: float = DEFAULT
                 ) -> tuple[float | None, Rule]:
    """What the daemon does: the shipped calibration's gate and threshold."""
    cal = read_calibration()
    t = threshold(cal, max_error)
    return t, lambda r: t is not None and r["cos"] >= cal.gate and r["p"] > t


def quality(rows: list[dict[str, Any]], vec: dict[str, np.ndarray]) -> dict[str, Any]:
    t, rule = default_rule(rows)
    out: dict[str, Any] = {"max_error": DEFAULT, "threshold": t, "gate": read_calibration().gate,
                           "pairs": by_split(rows, rule),
                           "kinds_held_out": by_kind(rows, rule, HELD_OUT),
                           "kinds_calibration": by_kind(rows, rule, CALIBRATION),
                           "kinds_development": by_kind(rows, rule, DEVELOPMENT)}
    curve = {}
    for e in BOUNDS:
        te, r_e = default_rule(rows, e)
        curve[str(e)] = {"threshold": te, **{sp: rates(part, [r_e(r) for r in part])
                                             for sp in HELD_OUT
                                             if (part := [x for x in rows if x["split"] == sp])}}
    out["curve"] = curve
    cos_curve = {}
    for e in BOUNDS:
        tc, rc = calibrated(rows, lambda r: r["cos"], lambda r: True, e)
        cos_curve[str(e)] = {"threshold": tc, **{sp: rates(part, [rc(r) for r in part])
                                                 for sp in HELD_OUT
                                                 if (part := [x for x in rows if x["split"] == sp])}}
    out["curve_cosine_alone"] = cos_curve
    pv = _memo_verifier(rows)
    out["stream"] = {sp: stream([r for r in rows if r["split"] == sp], vec, pv)
                     for sp in HELD_OUT}
    return out


class Precomputed:
    """An EmbedderLike over vectors computed beforehand (the stream)."""

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


def _memo_verifier(rows: list[dict[str, Any]]) -> Callable[[str, str], float]:
    """The verifier's scores computed beforehand, and the real one for pairs that are no
    labelled pair (a near miss meeting another group's anchor in the stream)."""
    known = {(r["a"], r["b"]): float(r["p"]) for r in rows}
    real: list[PairVerifier] = []

    def score(cached: str, query: str) -> float:
        if (cached, query) in known:
            return known[(cached, query)]
        if not real:
            real.append(PairVerifier(None, default_embedding_model(), threads=1))
        known[(cached, query)] = real[0].probability(cached, query)
        return known[(cached, query)]

    return score


def stream(rows: list[dict[str, Any]], vec: dict[str, np.ndarray],
           verifier: Callable[[str, str], float], seed: int = 0) -> dict[str, Any]:
    cache = SemanticCache(":memory:", Precomputed(vec, "bench"), verifier=verifier,
                          calibration=read_calibration())
    truth: dict[str, str] = {}
    for r in rows:
        truth.setdefault(r["a"], r["answer_a"])
    events: list[tuple[str, int | None]] = [(a, None) for a in truth]
    tail = list(range(len(rows)))
    np.random.default_rng(seed).shuffle(tail)
    events += [(rows[i]["b"], i) for i in tail]
    req = CacheRequest(model="bench", tenant="t", client="c", prompt="")
    n = {"para": 0, "para_hit": 0, "near": 0, "near_wrong": 0, "hits": 0, "wrong": 0}
    answers: dict[int, str] = {}
    for text, i in events:
        want = truth[text] if i is None else rows[i]["answer_b"]
        q = replace(req, prompt=text)
        got = cache.lookup(q, vector=vec[text])
        served = None
        if got.hit:
            served = answers[got.entry_id or 0]
            n["hits"] += 1
            n["wrong"] += served != want
        else:
            eid = cache.insert(q, want, vector=vec[text])
            answers[eid or 0] = want
        if i is not None and rows[i]["same"]:
            n["para"] += 1
            n["para_hit"] += served == want
        elif i is not None:
            n["near"] += 1
            n["near_wrong"] += served is not None and served != want
    return {"lookups": len(events), "served": round(n["para_hit"] / n["para"], 4),
            "false": round(n["near_wrong"] / n["near"], 4), "false_n": n["near_wrong"],
            "wrong_share_of_hits": round(n["wrong"] / max(1, n["hits"]), 4), "hits": n["hits"]}


def plot(q: dict[str, Any], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.8))
    colors = {"fresh4": "tab:blue", "fresh5": "tab:orange", "fresh6": "tab:green"}
    for sp, color in colors.items():
        for key, ls, label in (("curve", "-", "verifier, calibrated"),
                               ("curve_cosine_alone", ":", "cosine alone, calibrated")):
            pts = [(float(e), v[sp]) for e, v in q[key].items()]
            ax1.plot([p["false"] for _, p in pts], [p["served"] for _, p in pts], ls,
                     marker=".", color=color, label=f"{sp}: {label}")
            if key == "curve":
                ax2.plot([p["served"] for _, p in pts], [p["precision"] for _, p in pts], ls,
                         marker=".", color=color, label=f"{sp}: {label}")
        d = q["pairs"][sp]
        ax1.plot(d["false"], d["served"], "o", ms=11, mfc="none", color=color)
        ax2.plot(d["served"], d["precision"], "o", ms=11, mfc="none", color=color)
    ax1.axvline(DEFAULT, color="grey", lw=0.8)
    ax1.set(xlabel="false hits (share of near misses served)",
            ylabel="served (share of paraphrases)", xscale="symlog", xlim=(0, 0.5), ylim=(0, 1),
            title="held-out splits, max_error 0.001 to 0.2 (circle: default 0.01)")
    ax1.set_xscale("symlog", linthresh=0.01)
    ax2.set(xlabel="served (share of paraphrases)", ylabel="precision (right answers served)",
            xlim=(0, 1), ylim=(0.8, 1.005), title="precision against served share")
    ax1.legend(loc="lower right", fontsize=8)
    ax2.legend(loc="lower left", fontsize=8)
    fig.suptitle("meshd answer cache, semantic path: pair-verifier-v1 above the threshold of a "
                 "95% Clopper-Pearson bound\non the calibration splits' near misses, cosine gate "
                 "0.79 (all-MiniLM-L6-v2 int8); dotted: the cosine alone, calibrated the same way")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)


# -- ablation ---------------------------------------------------------------------------------


def old_meshd(rev: str) -> types.SimpleNamespace:
    """The lexical guards (v1-v4) and the adaptive per-entry thresholds as they were at git
    revision ``rev``, imported from that commit's files under another package name."""
    names = ("lexical", "wordclasses", "structure", "guards", "align", "policy")
    pkg = types.ModuleType("oldcache")
    pkg.__path__ = []
    sys.modules["oldcache"] = pkg
    mods = {}
    for name in names:
        src = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:meshd/cache/{name}.py"],
                             check=True, capture_output=True, text=True).stdout
        src = re.sub(r"\bmeshd\.cache\.", "oldcache.", src)
        mod = types.ModuleType(f"oldcache.{name}")
        sys.modules[mod.__name__] = mod
        exec(compile(src, f"{rev}:meshd/cache/{name}.py", "exec"), mod.__dict__)
        mods[name] = mod
    return types.SimpleNamespace(**mods)


def adaptive_twofold(rows: list[dict[str, Any]], policy: Any, score: str) -> dict[str, bool]:
    """vCache-style per-entry thresholds (meshd's ``AdaptiveThreshold``): each anchor's pairs
    split in two halves; the entry learns from one half's labels (as if those lookups had been
    verified) and is judged on the other, then the halves swap."""
    groups: dict[str, list[int]] = {}
    for i, r in enumerate(rows):
        groups.setdefault(r["a"], []).append(i)
    served: dict[str, bool] = {}
    for n, idx in enumerate(groups.values()):
        order = list(idx)
        np.random.default_rng(n).shuffle(order)
        halves = (order[::2], order[1::2])
        for train, test in ((halves[0], halves[1]), (halves[1], halves[0])):
            obs: tuple[tuple[float, bool], ...] = ()
            for i in train:
                obs = policy.observe(obs, float(rows[i][score]), bool(rows[i]["same"]))
            for i in test:
                r = rows[i]
                d = policy.decide(float(r[score]), r["b"], r["a"], obs, u=1.0)
                served[r["a"] + "\x00" + r["b"]] = d.kind == "hit"
    return served


def ablation(rows: list[dict[str, Any]], rev: str) -> dict[str, Any]:
    old = old_meshd(rev)
    rules = [why for why, _ in old.guards.GUARDS]
    for r in rows:
        r["guards"] = [why for why, f in old.guards.GUARDS if f(r["b"], r["a"])]
    gate = read_calibration().gate
    p = lambda r: r["p"]  # noqa: E731
    at_gate = lambda r: r["cos"] >= gate  # noqa: E731
    configs: dict[str, tuple[Callable[[dict[str, Any]], float], Callable[[dict[str, Any]], bool]]] = {
        "default: verifier, cosine gate 0.79, calibrated": (p, at_gate),
        "without the cosine gate": (p, lambda r: True),
        "cosine gate 0.70": (p, lambda r: r["cos"] >= 0.70),
        "without the verifier: cosine alone, calibrated": (lambda r: r["cos"], lambda r: True),
        "+ all lexical guards (v1-v4)": (p, lambda r: at_gate(r) and not r["guards"]),
        "cosine alone + all lexical guards": (lambda r: r["cos"], lambda r: not r["guards"]),
    }
    for rule in rules:
        configs[f"+ guard '{rule}' alone"] = (p, lambda r, g=rule: at_gate(r) and g not in r["guards"])
    for rule in rules:
        configs[f"all guards but '{rule}'"] = (
            p, lambda r, g=rule: at_gate(r) and not set(r["guards"]) - {g})
    out: dict[str, Any] = {}
    for name, (score, gate_fn) in configs.items():
        t, rule_fn = calibrated(rows, score, gate_fn)
        out[name] = {"threshold": t, **by_split(rows, rule_fn)}
    # a measured combination of the two scores (logistic regression on the development splits)
    dev = [r for r in rows if r["split"] in DEVELOPMENT]
    w = _logistic([_features(r) for r in dev], [r["same"] for r in dev])
    combo = lambda r: float(np.dot(w, _features(r)))  # noqa: E731
    t, rule_fn = calibrated(rows, combo, at_gate)
    out["logistic(logit p, cosine), fitted on development, gate 0.79"] = {
        "threshold": t, "weights": [round(float(x), 3) for x in w], **by_split(rows, rule_fn)}
    # the old default: guards v1-v4, cosine 0.79, verifier p >= 0.55 (not calibrated)
    out["before: guards + cosine 0.79 + verifier p >= 0.55 (uncalibrated)"] = by_split(
        rows, lambda r: r["cos"] >= 0.79 and not r["guards"] and r["p"] >= 0.55)
    # vCache-style per-entry thresholds, as meshd had them
    for score, kw, name in (
            ("cos", {"guards": False}, "per-entry adaptive thresholds on the cosine (delta 0.01)"),
            ("cos", {}, "per-entry adaptive thresholds on the cosine + guards (delta 0.01)"),
            ("p", {"guards": False, "prior_t": 0.5, "prior_sd": 0.2, "slope": 20.0,
                   "floor": 0.0, "ceiling": 0.9999},
             "per-entry adaptive thresholds on the verifier's p (delta 0.01)")):
        policy = old.policy.AdaptiveThreshold(**kw)
        served: dict[str, bool] = {}
        for sp in (*CALIBRATION, *HELD_OUT, *DEVELOPMENT):
            served.update(adaptive_twofold([r for r in rows if r["split"] == sp], policy, score))
        out[name] = by_split(rows, lambda r, s=served: s[r["a"] + "\x00" + r["b"]])
    for r in rows:
        del r["guards"]
    return out


def _features(r: dict[str, Any]) -> list[float]:
    p = min(max(float(r["p"]), 1e-6), 1 - 1e-6)
    return [math.log(p / (1 - p)), float(r["cos"]), 1.0]


def _logistic(x: list[list[float]], y: list[bool], steps: int = 3000) -> np.ndarray:
    X, Y = np.array(x), np.array(y, float)
    w = np.zeros(X.shape[1])
    for _ in range(steps):
        pr = 1 / (1 + np.exp(-(X @ w)))
        w -= 0.5 * (X.T @ (pr - Y) / len(Y) + 1e-3 * np.r_[w[:-1], 0])
    return w


# -- speed ------------------------------------------------------------------------------------


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


def speed(rows: list[dict[str, Any]], model_dir: Path, vec: dict[str, np.ndarray],
          entries: int, root: Path) -> dict[str, Any]:
    emb = load_embedder(model_dir, precision="int8")
    pv = PairVerifier(None, model_dir)
    cal = read_calibration()
    limits = CacheLimits(max_entries=entries + 1000, max_bytes=2**40)
    req = CacheRequest(model="bench", tenant="t", client="c", prompt="")
    path = root / "cache.db"
    anchors = sorted({r["a"] for r in rows})
    cache = SemanticCache(path, emb, verifier=pv.probability, calibration=cal, limits=limits)
    for a in anchors:
        cache.insert(replace(req, prompt=a), f"answer to {a}")
    part = cache.db.execute("SELECT partition FROM entries LIMIT 1").fetchone()[0]
    now = time.time()
    add_synthetic(cache, part, np.stack(list(vec.values())), entries - len(anchors), now=now,
                  last_used=now)
    cache.close()
    rss0 = rss_bytes()
    t0 = time.perf_counter()
    cache = SemanticCache(path, emb, verifier=pv.probability, calibration=cal, limits=limits)
    open_s = time.perf_counter() - t0
    rss1 = rss_bytes()
    cache.close()  # saves the HNSW graph: the next open loads it
    t0 = time.perf_counter()
    cache = SemanticCache(path, emb, verifier=pv.probability, calibration=cal, limits=limits)
    open_saved_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    bare = SemanticCache(path, limits=limits)  # what the daemon opens at start: no model
    open_exact_s = time.perf_counter() - t0
    bare.close()
    st = cache.statistics()
    timed: dict[str, list[float]] = {"semantic": [], "miss": [], "refused": [], "embed": [],
                                     "search": []}
    parts = ("embed_ms", "index_ms", "verify_ms", "embed_cpu_ms", "verify_cpu_ms")
    hit_parts: dict[str, list[float]] = {k: [] for k in parts}  # of the semantic hits
    for r in [r for r in rows if r["same"]][:400]:
        t = time.perf_counter()
        got = cache.lookup(replace(req, prompt=r["b"]))
        dt = (time.perf_counter() - t) * 1e3
        timed.setdefault(got.kind, []).append(dt)
        timed["embed"].append(got.embed_ms)
        timed["search"].append(got.search_ms)
        if got.kind == "semantic":
            for k in parts:
                hit_parts[k].append(getattr(got, k))
    exact = []
    for a in anchors[:300]:
        t = time.perf_counter()
        got = cache.lookup_exact(replace(req, prompt=a))
        exact.append((time.perf_counter() - t) * 1e3)
        assert got is not None and got.kind == "exact"

    def p(xs: list[float], q: float) -> float:
        return round(float(np.percentile(xs, q)), 3) if xs else float("nan")

    return {
        "entries": st["entries"], "index": st["index_kinds"], "index_bytes": st["index_bytes"],
        "sqlite_file_bytes": path.stat().st_size, "rss_of_open_cache_bytes": rss1 - rss0,
        "restart_rebuilding_index_s": round(open_s, 2),
        "restart_loading_saved_index_s": round(open_saved_s, 2),
        "open_without_model_s": round(open_exact_s, 2),
        "exact_lookup_ms": {"n": len(exact), "p50": p(exact, 50), "p99": p(exact, 99)},
        **{f"{k}_lookup_ms": {"n": len(v), "p50": p(v, 50), "p99": p(v, 99)}
           for k, v in timed.items() if k not in ("embed", "search")},
        "embed_ms_p50": p(timed["embed"], 50), "search_and_verify_ms_p50": p(timed["search"], 50),
        "semantic_hit_phases_ms_p50": {k: p(v, 50) for k, v in hit_parts.items()},
    }


def verifier_ab(rows: list[dict[str, Any]], model_dir: Path, n: int) -> dict[str, Any]:
    """The pair verifier as the daemon runs it (two threads), without (A) and with (B) its
    spinning twin, interleaved pair by pair in one process: wall and process CPU time per
    score, how often B spun (only when the cores are free), and whether any score differs."""
    a = PairVerifier(None, model_dir, spin=False)
    b = PairVerifier(None, model_dir, spin=True)
    wall: dict[str, list[float]] = {"a": [], "b": []}
    cpu: dict[str, list[float]] = {"a": [], "b": []}
    differ = 0
    for i in range(n):
        r = rows[i % len(rows)]
        got = {}
        for name, v in (("a", a), ("b", b)) if i % 2 == 0 else (("b", b), ("a", a)):
            t, c = time.perf_counter(), time.process_time()
            got[name] = v.probability(r["a"], r["b"])
            wall[name].append((time.perf_counter() - t) * 1e3)
            cpu[name].append((time.process_time() - c) * 1e3)
        differ += got["a"] != got["b"]

    def p(xs: list[float], q: float) -> float:
        return round(float(np.percentile(xs, q)), 3)

    return {"pairs": n, "scores_differing": differ, "b_spun": b.spin_calls,
            **{f"{k}_wall_ms": {"p50": p(wall[k], 50), "p90": p(wall[k], 90)} for k in wall},
            **{f"{k}_process_cpu_ms_p50": p(cpu[k], 50) for k in cpu}}


def pid_rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def fill_daemon_cache(path: Path, model_dir: Path, vec: dict[str, np.ndarray], total: int
                      ) -> dict[str, Any]:
    """With the daemon stopped: add synthetic rows to its cache file (the partition its anchors
    went to) until it holds ``total`` entries, older than the anchors, then open it once with
    the model to build the HNSW graph and close it to save the graph, as the daemon's own
    shutdown would; the daemon loads that graph when its semantic path starts."""
    limits = CacheLimits(max_entries=total + 1000, max_bytes=2**40)
    emb = load_embedder(model_dir, precision="int8")
    cache = SemanticCache(path, emb, limits=limits)
    parts = cache.db.execute("SELECT partition, count(*) FROM entries GROUP BY partition "
                             "ORDER BY count(*) DESC").fetchall()
    part, have = parts[0][0], sum(r[1] for r in parts)
    now = time.time()
    add_synthetic(cache, part, np.stack(list(vec.values())), total - have, now=now,
                  last_used=now - 3600)
    cache.close()
    t1 = time.perf_counter()
    cache = SemanticCache(path, emb, limits=limits)
    build_s = time.perf_counter() - t1
    st = cache.statistics()
    cache.close()
    return {"entries": st["entries"], "index": st["index_kinds"],
            "graph_build_s": round(build_s, 1), "sqlite_file_bytes": path.stat().st_size}


def hit_phases(sock: str, rid: str) -> dict[str, float]:
    """Where a semantic hit's lookup spent its time, from its ``cache_hit`` journal event
    (``meshd explain``): ``start_ms``, ``queued_ms``, ``embed_ms``, ``search_ms``,
    ``handoff_ms``."""
    import trio

    from meshd.control.client import call
    from meshd.core.messages import MessageType

    record = trio.run(call, sock, MessageType.EXPLAIN_REQ, {"rid": rid})["record"] or {}
    hit = next((e["payload"] for e in record.get("events", []) if e["kind"] == "cache_hit"), {})
    return {k: float(v) for k, v in hit.items() if k.endswith("_ms") and v is not None}


def daemon_e2e(rows: list[dict[str, Any]], root: Path, n: int, model_dir: Path, *,
               fill: int = 0, vec: dict[str, np.ndarray] | None = None,
               serve: str = "default") -> dict[str, Any]:
    import trio

    from meshd.testing.wait import wait_for
    from meshd.testnet.drive import cli, stream
    from meshd.testnet.launcher import NodeSpec, down, up

    spec = NodeSpec(name="c1", models=[{"path": serve}], extra={"cache": {"enabled": True}})
    chat = serve != "default"  # an instruct model answers as a chat
    index = up(root / "net", [spec], advert_interval_s=1.0)
    sock = index["nodes"][0]["socket"]
    memory: dict[str, Any] = {}

    def stats() -> dict[str, Any]:
        return dict(json.loads(cli("cache", "stats", "--json", "--socket", sock).stdout))

    first: list[float] = []

    def ask(prompt: str, **extra: Any) -> tuple[dict[str, Any], float]:
        """(DONE stats, submit to DONE ms); ``first[-1]``: submit to the first tokens, ms.
        Answers of ``ANSWER_TOKENS`` tokens unless said (the partition holds max_tokens: the
        paraphrases and repeats ask what the anchors asked)."""
        fields = {"prompt": prompt, "max_tokens": ANSWER_TOKENS, "temperature": 0.0,
                  "client": "bench", "chat": chat, **extra}
        t = time.monotonic()
        got = trio.run(stream, sock, fields, lambda _: first.append((time.monotonic() - t) * 1e3))
        return got["stats"], (got["done_at"] - t) * 1e3

    try:
        ask(f"Warm up {time.time()}.", client="warmup")
        wait_for(lambda: stats()["state"] == "ready", 300, "the semantic cache to load")
        anchors = sorted({r["a"] for r in rows})
        before = stats()["inserts"]
        for a in anchors:
            ask(a)
        wait_for(lambda: stats()["inserts"] >= before + len(anchors), 300,
                 "the anchors to be stored")
        if fill:
            down(root / "net")
            memory["fill"] = fill_daemon_cache(root / "net" / "c1" / "state" / "semantic-cache.db",
                                               model_dir, vec or {}, fill)
            index = up(root / "net", [spec], advert_interval_s=1.0)
            sock, pid = index["nodes"][0]["socket"], index["nodes"][0]["pid"]
            memory["rss_started_bytes"] = pid_rss_bytes(pid)
            t0 = time.perf_counter()
            ask(f"Warm up {time.time()}.", client="warmup")
            wait_for(lambda: stats()["state"] == "ready", 600, "the semantic cache to load")
            memory["semantic_path_load_s"] = round(time.perf_counter() - t0, 1)
            memory["rss_cache_ready_bytes"] = pid_rss_bytes(pid)
            for a in anchors[:20]:  # warm the hit path
                ask(a)
        paraphrases = [r["b"] for r in rows if r["same"]]
        hit_ms, repeat_ms, miss_first, off_first = [], [], [], []
        answer_chars: list[float] = []
        phases: dict[str, list[float]] = {}  # a semantic hit's, from its journal (not timed)
        kinds: dict[str, int] = {}
        for i in range(n):
            st, ms = ask(paraphrases[i % len(paraphrases)])
            kind = (st.get("cache") or {}).get("kind", "miss")
            kinds[kind] = kinds.get(kind, 0) + 1
            if kind == "semantic":
                hit_ms.append(ms)
                answer_chars.append(len(str(st.get("text") or "")))
                phases.setdefault("daemon_ttft_ms", []).append(float(st["ttft_ms"]))
                phases.setdefault("after_daemon_ttft_ms", []).append(ms - float(st["ttft_ms"]))
                for k, v in hit_phases(sock, str(st["request_id"])).items():
                    phases.setdefault(k, []).append(v)
            st, ms = ask(anchors[i % len(anchors)])
            if (st.get("cache") or {}).get("kind") == "exact":
                repeat_ms.append(ms)
            ask(f"Tell me something new about topic number {i} and its history.", max_tokens=1)
            miss_first.append(first[-1])
            ask(f"Tell me something new about topic number {i + 50_000} and its history.",
                cache=False, max_tokens=1)
            off_first.append(first[-1])
        final = stats()
        if fill:
            memory["rss_end_bytes"] = pid_rss_bytes(index["nodes"][0]["pid"])
    finally:
        down(root / "net")

    def p(xs: list[float], q: float) -> float:
        return round(float(np.percentile(xs, q)), 2) if xs else float("nan")

    return {
        **memory, "paraphrases_asked": kinds, "served_model": serve,
        "hit_answer_chars_p50": p(answer_chars, 50),
        "semantic_hit_submit_to_done_ms": {"n": len(hit_ms), "p50": p(hit_ms, 50),
                                           "p95": p(hit_ms, 95), "p99": p(hit_ms, 99)},
        "semantic_hit_phases_ms_p50": {k: p(v, 50) for k, v in phases.items()},
        "exact_repeat_submit_to_done_ms": {"n": len(repeat_ms), "p50": p(repeat_ms, 50),
                                           "p95": p(repeat_ms, 95), "p99": p(repeat_ms, 99)},
        "miss_client_first_token_ms": {"p50": p(miss_first, 50), "p99": p(miss_first, 99)},
        "cache_false_client_first_token_ms": {"p50": p(off_first, 50), "p99": p(off_first, 99)},
        "miss_adds_p50_ms_paired": round(float(np.median(np.array(miss_first)
                                                         - np.array(off_first))), 2),
        "cache": {k: final.get(k) for k in ("state", "entries", "exact_hits", "semantic_hits",
                                            "refused", "misses", "inserts")},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quality", action="store_true")
    ap.add_argument("--plot", type=Path, default=ROOT / "docs" / "img" / "cache_bound.png")
    ap.add_argument("--ablation", metavar="REV", default=None,
                    help="compare with the decision rules meshd had at this git revision")
    ap.add_argument("--speed", action="store_true")
    ap.add_argument("--entries", type=int, default=100_000)
    ap.add_argument("--verifier-ab", type=int, default=0, metavar="N",
                    help="N pairs scored by the verifier without and with its spinning twin")
    ap.add_argument("--daemon", type=int, default=0, metavar="N")
    ap.add_argument("--daemon-entries", type=int, default=0, metavar="E")
    ap.add_argument("--daemon-model", default="default", metavar="DIR",
                    help="the model the daemon serves (default: the shipped tiny-en); another "
                    "model directory is asked in chat form")
    ap.add_argument("--splits", default="fresh4,fresh5",
                    help="--speed and --daemon: the splits whose pairs are asked")
    ap.add_argument("--scores", type=Path, default=Path(tempfile.gettempdir()) / "meshd-cache-scores.jsonl",
                    help="keep the verifier's scores of the pairs here between runs")
    ap.add_argument("--model", type=Path, default=None, metavar="DIR")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    model_dir = args.model or default_embedding_model()
    rows = load_pairs()
    t0 = time.perf_counter()
    vec, rows = score_pairs(rows, model_dir, args.scores)
    result: dict[str, Any] = {"scoring_s": round(time.perf_counter() - t0, 1),
                              "loadavg_1min_start": os.getloadavg()[0]}
    if args.quality:
        result["quality"] = quality(rows, vec)
        plot(result["quality"], args.plot)
    if args.ablation:
        result["ablation"] = ablation(rows, args.ablation)
    some = [r for r in rows if r["split"] in args.splits.split(",")]
    if args.verifier_ab:
        result["verifier_ab"] = verifier_ab(some, model_dir, args.verifier_ab)
    with tempfile.TemporaryDirectory() as tmp:
        if args.speed:
            result["speed"] = speed(some, model_dir, vec, args.entries, Path(tmp))
        if args.daemon:
            result["daemon"] = daemon_e2e(some, Path(tmp), args.daemon, model_dir,
                                          fill=args.daemon_entries, vec=vec,
                                          serve=args.daemon_model)
    result["loadavg_1min_end"] = os.getloadavg()[0]
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
