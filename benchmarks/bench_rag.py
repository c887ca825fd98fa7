"""Retrieval figures for issue 16 (docs/rag.md, docs/benchmarks.md): quality on labelled
questions, indexing rate, and retrieval latency over 50,000 chunks.

    .venv/bin/python benchmarks/bench_rag.py [--chunks 50000] [--queries 300] [--out FILE.json]
                                             [--embed-all]

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


def latency(stores: dict[str, RagStore], qs: list[dict[str, Any]], n: int) -> dict[str, Any]:
    """Each question asked of every store in turn (so they share the box's load), ``n`` each."""
    times: dict[str, tuple[list[float], list[float], list[float]]] = {k: ([], [], []) for k in stores}
    for i in range(n):
        for name, store in stores.items():
            t0 = time.perf_counter()
            got = store.query("big", qs[i % len(qs)]["question"], 5)
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--chunks", type=int, default=50_000)
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--seed", type=int, default=16)
    ap.add_argument("--embed-all", action="store_true",
                    help="embed every generated chunk instead of composing its vector")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--quick", action="store_true", help="skip the no_headings variant")
    ap.add_argument("--keep", type=Path, help="keep the stores in this folder (default: a temporary one)")
    args = ap.parse_args()
    qs = questions()
    emb = load_embedder()
    result: dict[str, Any] = {"questions": len(qs), "embedder": emb.identity,
                              "threads": emb.threads, "load_avg_start": os.getloadavg()}
    with tempfile.TemporaryDirectory() as scratch:
        tmp = str(args.keep or scratch)
        Path(tmp).mkdir(parents=True, exist_ok=True)
        # -- quality and indexing rate ------------------------------------------------------
        store = RagStore(Path(tmp) / "docs.db", emb)
        rep = store.add("docs", [CORPUS])
        result["indexing"] = {"files": rep.files_added, "chunks": rep.chunks,
                              "seconds": round(rep.seconds, 2),
                              "chunks_per_s": round(rep.chunks / rep.seconds, 2),
                              "embed_share": round(rep.embed_seconds / rep.seconds, 3)}
        print(f"indexed {rep.chunks} chunks of {rep.files_added} files in {rep.seconds:.1f} s: "
              f"{rep.chunks / rep.seconds:.1f} chunks/s ({rep.embed_seconds / rep.seconds:.0%} "
              "embedding)", flush=True)
        result["quality"] = quality(store, CORPUS, qs)
        print("quality (headings kept):", json.dumps(result["quality"]), flush=True)
        if not args.quick:
            bare = Path(tmp) / "bare"
            blank_headings(CORPUS, bare)
            plain = RagStore(Path(tmp) / "bare.db", emb)
            plain.add("docs", [bare])
            result["quality_no_headings"] = quality(plain, bare, qs)
            print("quality (no headings):  ", json.dumps(result["quality_no_headings"]), flush=True)
            plain.close()
        # -- latency over --chunks chunks ----------------------------------------------------
        rows = store.db.execute("SELECT text, vector FROM chunks WHERE collection = 'docs'").fetchall()
        texts = [r[0] for r in rows]
        vecs = np.frombuffer(b"".join(r[1] for r in rows), np.float32).reshape(len(rows), -1)
        rng = np.random.default_rng(args.seed)
        t0 = time.perf_counter()
        made_texts: list[str] = list(texts)
        made_vecs = [vecs]
        need = max(0, args.chunks - len(texts))
        a = rng.integers(0, len(texts), need)
        b = rng.integers(0, len(texts), need)
        w = rng.uniform(0.3, 0.7, need).astype(np.float32)
        made_texts += [texts[i][len(texts[i]) // 2:] + "\n\n" + texts[j][:len(texts[j]) // 2]
                       for i, j in zip(a.tolist(), b.tolist(), strict=True)]
        if args.embed_all:
            made_vecs.append(emb.embed(made_texts[len(texts):]))
        else:
            mix = w[:, None] * vecs[a] + (1 - w)[:, None] * vecs[b]
            mix += rng.normal(0, 0.02, mix.shape).astype(np.float32)
            made_vecs.append(mix / np.linalg.norm(mix, axis=1, keepdims=True))
        allv = np.concatenate(made_vecs).astype(np.float32)
        gen_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        per_file = 1000
        for f in range(0, len(made_texts), per_file):
            part = made_texts[f:f + per_file]
            store.put_chunks("big", f"/generated/part-{f // per_file:03d}.txt",
                             [Chunk(t, 1, 1) for t in part], allv[f:f + per_file])
        write_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        store.query("big", "warm up: build the graph", 5)
        build_s = time.perf_counter() - t0
        n = len(made_texts)
        result["big"] = {"chunks": n, "vectors": "embedded" if args.embed_all else "composed",
                         "generate_s": round(gen_s, 2), "sqlite_write_s": round(write_s, 2),
                         "sqlite_rows_per_s": round(n / write_s, 1),
                         "hnsw_build_s": round(build_s, 2)}
        print(f"{n} chunks: sqlite {write_s:.1f} s, first query (builds the HNSW graph) "
              f"{build_s:.1f} s", flush=True)
        exact = RagStore(Path(tmp) / "docs.db", emb, exact_max=10**9)
        exact.query("big", "warm up", 5)
        both = latency({"hnsw": store, "exact": exact}, qs, args.queries)
        result.update(both)
        print("hnsw: ", json.dumps(result["hnsw"]), flush=True)
        print("exact:", json.dumps(result["exact"]), flush=True)
        agree = []
        for q in qs[:100]:
            got = {h.chunk_id for h in store.query("big", q["question"], 5).hits}
            want = {h.chunk_id for h in exact.query("big", q["question"], 5).hits}
            agree.append(len(got & want) / max(1, len(want)))
        result["hnsw_recall_of_exact_top5"] = round(float(np.mean(agree)), 4)
        result["ratio_p50_hnsw_over_exact"] = round(result["hnsw"]["p50_ms"] / result["exact"]["p50_ms"], 3)
        result["ratio_search_p50_hnsw_over_exact"] = round(
            result["hnsw"]["search_p50_ms"] / max(1e-9, result["exact"]["search_p50_ms"]), 4)
        print(f"hnsw/exact p50 {result['ratio_p50_hnsw_over_exact']}x, search only "
              f"{result['ratio_search_p50_hnsw_over_exact']}x; hnsw recall of the exact top 5 "
              f"{result['hnsw_recall_of_exact_top5']}", flush=True)
        exact.close()
        store.close()
    result["load_avg_end"] = os.getloadavg()
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
