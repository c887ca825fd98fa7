"""Retrieval figures for issue 16 (docs/rag.md, docs/benchmarks.md): quality on labelled
questions, indexing rate, and retrieval latency over 50,000 chunks.

    .venv/bin/python benchmarks/bench_rag.py [--chunks 50000] [--queries 300] [--out FILE.json]
                                             [--embed-all] [--precisions fp32,int8] [--quick]

Every figure is taken for each embedding precision of ``--precisions`` (a collection's
precision, docs/rag.md: ``fp32`` the float graph, ``int8`` the quantized one), side by side in
the same run: one store per precision, indexed and asked with its own graph; the latency
questions go to each in turn, so they share the box's load. ``int8_over_fp32`` gives the ratios.

Quality, on benchmarks/data/rag_questions.jsonl over the snapshot of meshd's docs in
benchmarks/data/rag_corpus/ (made by benchmarks/data/make_rag_questions.py): the snapshot is
indexed with ``RagStore.add`` (the chunker's defaults, all-MiniLM-L6-v2), every question asks
for 10 chunks, and a chunk is relevant when it comes from the labelled file and its line range
overlaps the labelled lines. recall@5: share of questions with a relevant chunk in the first 5;
MRR@10: mean of 1/rank of the first relevant chunk (0 when none in 10). Twice: on the docs as
they are, and with every heading line blanked (``no_headings``): the heading questions are made
from the headings, so the first figure flatters them; the second measures finding a section by
its body alone.

Indexing rate: chunks/s of ``RagStore.add`` on the snapshot (read, chunk, embed, write SQLite),
embedding included, and the share of it spent embedding.

Latency, over ``--chunks`` chunks in one collection: the real chunks of the snapshot plus
generated ones, each the second half of one real chunk joined to the first half of another
(seeded), stored through ``RagStore.put_chunks``. Their vectors are *composed*, not embedded
(the two real chunks' embeddings mixed with a random weight, plus noise, renormalised; as
bench_cache.py does) unless ``--embed-all`` is given: embedding 50,000 chunks takes hours on the
2 shared cores this was run on (the indexing rate above says how long). A query is
``RagStore.query``: embed the question, search the HNSW graph (usearch, the semantic cache's
index), read the chunks' rows; its wall time and the split (embedding, search + rows) are
reported. Baseline in the same run: the exact search (one matrix-vector product over all
vectors) on the same store, and the HNSW graph's recall of the exact top 5.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from meshd.embed import load_embedder  # noqa: E402
from meshd.rag.chunking import Chunk  # noqa: E402
from meshd.rag.store import RagStore  # noqa: E402

DATA = ROOT / "benchmarks" / "data"
QUESTIONS = DATA / "rag_questions.jsonl"
CORPUS = DATA / "rag_corpus"


def pct(xs: list[float], p: float) -> float:
    return float(np.percentile(np.asarray(xs), p)) if xs else float("nan")


def questions() -> list[dict[str, Any]]:
    return [json.loads(line) for line in QUESTIONS.read_text().splitlines() if line.strip()]


def blank_headings(src: Path, dest: Path) -> None:
    """Copy the corpus with every Markdown heading line emptied (line numbers kept)."""
    for f in src.rglob("*.md"):
        out = dest / f.relative_to(src)
        out.parent.mkdir(parents=True, exist_ok=True)
        fence = False
        lines = []
        for line in f.read_text().split("\n"):
            if line.lstrip().startswith(("```", "~~~")):
                fence = not fence
            lines.append("" if not fence and line.lstrip().startswith("#") else line)
        out.write_text("\n".join(lines))


def quality(store: RagStore, corpus: Path, qs: list[dict[str, Any]]) -> dict[str, Any]:
    per_kind: dict[str, list[tuple[bool, float]]] = {}
    root = str(corpus.resolve()) + os.sep
    for q in qs:
        hits = store.query("docs", q["question"], 10).hits
        rank = 0
        for n, h in enumerate(hits, 1):
            rel = h.source[len(root):] if h.source.startswith(root) else h.source
            if rel == q["file"] and h.start_line <= q["end_line"] and h.end_line >= q["start_line"]:
                rank = n
                break
        per_kind.setdefault(q["kind"], []).append((0 < rank <= 5, 1.0 / rank if rank else 0.0))
        per_kind.setdefault("all", []).append((0 < rank <= 5, 1.0 / rank if rank else 0.0))
    return {k: {"questions": len(v), "recall_at_5": round(sum(r for r, _ in v) / len(v), 3),
                "mrr_at_10": round(sum(m for _, m in v) / len(v), 3)} for k, v in per_kind.items()}


def latency(stores: dict[str, RagStore], qs: list[dict[str, Any]], n: int,
            collection: str = "big") -> dict[str, Any]:
    """Each question asked of every store in turn (so they share the box's load), ``n`` each."""
    times: dict[str, tuple[list[float], list[float], list[float]]] = {k: ([], [], []) for k in stores}
    for i in range(n):
        for name, store in stores.items():
            t0 = time.perf_counter()
            got = store.query(collection, qs[i % len(qs)]["question"], 5)
            total, embed, search = times[name]
            total.append((time.perf_counter() - t0) * 1e3)
            embed.append(got.embed_ms)
            search.append(got.search_ms)
    out = {}
    for name, (total, embed, search) in times.items():
        out[name] = {
            "queries": n, "p50_ms": round(pct(total, 50), 2), "p99_ms": round(pct(total, 99), 2),
            "embed_p50_ms": round(pct(embed, 50), 2), "embed_p99_ms": round(pct(embed, 99), 2),
            "search_p50_ms": round(pct(search, 50), 3), "search_p99_ms": round(pct(search, 99), 3),
            "rest_p50_ms": round(statistics.median(t - e - s for t, e, s in
                                                   zip(total, embed, search, strict=True)), 3)}
    return out


def compose(texts: list[str], vecs: np.ndarray, need: int, seed: int,
            embed: Any = None) -> tuple[list[str], np.ndarray]:
    """``need`` generated chunks (half of one real chunk + half of another, seeded) and their
    vectors: composed from the two real ones (mixed, noised, renormalised), or ``embed``ded."""
    rng = np.random.default_rng(seed)
    a = rng.integers(0, len(texts), need)
    b = rng.integers(0, len(texts), need)
    w = rng.uniform(0.3, 0.7, need).astype(np.float32)
    made = [texts[i][len(texts[i]) // 2:] + "\n\n" + texts[j][:len(texts[j]) // 2]
            for i, j in zip(a.tolist(), b.tolist(), strict=True)]
    if embed is not None:
        return made, np.asarray(embed(made), np.float32)
    mix = w[:, None] * vecs[a] + (1 - w)[:, None] * vecs[b]
    mix += rng.normal(0, 0.02, mix.shape).astype(np.float32)
    return made, (mix / np.linalg.norm(mix, axis=1, keepdims=True)).astype(np.float32)


def run_precision(precision: str, emb: Any, tmp: Path, qs: list[dict[str, Any]],
                  args: argparse.Namespace) -> tuple[dict[str, Any], RagStore, RagStore]:
    """Quality, indexing rate and the 50,000-chunk store for one precision; returns its
    figures, its store (HNSW) and an exact-search store on the same file."""
    out: dict[str, Any] = {"embedder": emb.identity}
    store = RagStore(tmp / f"docs-{precision}.db", emb, precision=precision)
    rep = store.add("docs", [CORPUS])
    out["indexing"] = {"files": rep.files_added, "chunks": rep.chunks,
                       "seconds": round(rep.seconds, 2),
                       "chunks_per_s": round(rep.chunks / rep.seconds, 2),
                       "embed_share": round(rep.embed_seconds / rep.seconds, 3)}
    print(f"[{precision}] indexed {rep.chunks} chunks of {rep.files_added} files in "
          f"{rep.seconds:.1f} s: {rep.chunks / rep.seconds:.1f} chunks/s "
          f"({rep.embed_seconds / rep.seconds:.0%} embedding)", flush=True)
    out["quality"] = quality(store, CORPUS, qs)
    print(f"[{precision}] quality (headings kept):", json.dumps(out["quality"]), flush=True)
    if not args.quick:
        bare = tmp / f"bare-{precision}"
        blank_headings(CORPUS, bare)
        plain = RagStore(tmp / f"bare-{precision}.db", emb, precision=precision)
        plain.add("docs", [bare])
        out["quality_no_headings"] = quality(plain, bare, qs)
        print(f"[{precision}] quality (no headings):  ", json.dumps(out["quality_no_headings"]),
              flush=True)
        plain.close()
    # -- --chunks chunks -------------------------------------------------------------------
    rows = store.db.execute("SELECT text, vector FROM chunks WHERE collection = 'docs'").fetchall()
    texts = [r[0] for r in rows]
    vecs = np.frombuffer(b"".join(r[1] for r in rows), np.float32).reshape(len(rows), -1)
    t0 = time.perf_counter()
    made, made_vecs = compose(texts, vecs, max(0, args.chunks - len(texts)), args.seed,
                              emb.embed if args.embed_all else None)
    all_texts = texts + made
    allv = np.concatenate([vecs, made_vecs]).astype(np.float32)
    gen_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    per_file = 1000
    for f in range(0, len(all_texts), per_file):
        store.put_chunks("big", f"/generated/part-{f // per_file:03d}.txt",
                         [Chunk(t, 1, 1) for t in all_texts[f:f + per_file]],
                         allv[f:f + per_file])
    write_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    store.query("big", "warm up: build the graph", 5)
    build_s = time.perf_counter() - t0
    n = len(all_texts)
    out["big"] = {"chunks": n, "vectors": "embedded" if args.embed_all else "composed",
                  "generate_s": round(gen_s, 2), "sqlite_write_s": round(write_s, 2),
                  "sqlite_rows_per_s": round(n / write_s, 1), "hnsw_build_s": round(build_s, 2)}
    print(f"[{precision}] {n} chunks: sqlite {write_s:.1f} s, first query (builds the HNSW "
          f"graph) {build_s:.1f} s", flush=True)
    exact = RagStore(tmp / f"docs-{precision}.db", emb, exact_max=10**9, precision=precision)
    exact.query("big", "warm up", 5)
    return out, store, exact


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--chunks", type=int, default=50_000)
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--seed", type=int, default=16)
    ap.add_argument("--precisions", default="fp32,int8",
                    help="embedding precisions to measure side by side (comma-separated)")
    ap.add_argument("--threads", type=int, default=None,
                    help="onnxruntime intra-op threads of the embedders (default: one per core)")
    ap.add_argument("--embed-all", action="store_true",
                    help="embed every generated chunk instead of composing its vector")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--quick", action="store_true", help="skip the no_headings variant")
    ap.add_argument("--keep", type=Path, help="keep the stores in this folder (default: a temporary one)")
    args = ap.parse_args()
    precisions = [p.strip() for p in args.precisions.split(",") if p.strip()]
    qs = questions()
    embs = {p: load_embedder(precision=p, threads=args.threads) for p in precisions}
    result: dict[str, Any] = {"questions": len(qs), "precisions": precisions,
                              "threads": embs[precisions[0]].threads,
                              "load_avg_start": os.getloadavg()}
    with tempfile.TemporaryDirectory() as scratch:
        tmp = Path(args.keep or scratch)
        tmp.mkdir(parents=True, exist_ok=True)
        stores: dict[str, RagStore] = {}
        exacts: dict[str, RagStore] = {}
        for p in precisions:
            result[p], stores[p], exacts[p] = run_precision(p, embs[p], tmp, qs, args)
        # -- latency: every question to each store in turn; the exact fp32 search as baseline --
        asked = dict(stores)
        if "fp32" in exacts:
            asked["exact_fp32"] = exacts["fp32"]
        lat = latency(asked, qs, args.queries)
        result["load_avg_latency"] = os.getloadavg()
        for name, figures in lat.items():
            print(f"latency {name}: ", json.dumps(figures), flush=True)
            (result[name] if name in result else result.setdefault(name, {}))["latency"] = figures
        for p in precisions:
            agree = []
            for q in qs[:100]:
                got = {h.chunk_id for h in stores[p].query("big", q["question"], 5).hits}
                want = {h.chunk_id for h in exacts[p].query("big", q["question"], 5).hits}
                agree.append(len(got & want) / max(1, len(want)))
            result[p]["hnsw_recall_of_exact_top5"] = round(float(np.mean(agree)), 4)
        if "fp32" in precisions and "int8" in precisions:
            f, i = result["fp32"], result["int8"]
            result["int8_over_fp32"] = {
                "p50": round(i["latency"]["p50_ms"] / f["latency"]["p50_ms"], 3),
                "embed_p50": round(i["latency"]["embed_p50_ms"] / f["latency"]["embed_p50_ms"], 3),
                "recall_at_5": round(i["quality"]["all"]["recall_at_5"]
                                     / max(1e-9, f["quality"]["all"]["recall_at_5"]), 3),
                "indexing_chunks_per_s": round(i["indexing"]["chunks_per_s"]
                                               / f["indexing"]["chunks_per_s"], 3)}
            print("int8 / fp32:", json.dumps(result["int8_over_fp32"]), flush=True)
        for s in [*stores.values(), *exacts.values()]:
            s.close()
    result["load_avg_end"] = os.getloadavg()
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
