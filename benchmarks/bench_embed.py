"""Sentence-embedding figures of all-MiniLM-L6-v2 on onnxruntime (meshd.embed).

    .venv/bin/python benchmarks/bench_embed.py [--repeats 300] [--threads 1,2] [--out FILE.json]

For each onnxruntime intra-op thread count (``intra_op_num_threads``; inter-op 1, sequential
execution, graph optimisation ORT_ENABLE_ALL, no spin-waiting: the Embedder's defaults),
measured in the same process
and interleaved so that a noisy machine slows every setting alike:

- one sentence of exactly 32 tokens (special tokens included) through ``Embedder.embed``
  (tokenization included): p50 and p99 wall time, and p50 CPU time of the process;
- batches of 64 varied sentences (8 to 60 tokens; each call sorts, pads and runs one batch):
  p50 and p99 wall time per batch, and sentences/s at the p50.

It also checks the 50 sentences of tests/embed/sentences.py against the NumPy reference
(float64, one sentence at a time): the largest 1 - cosine and the largest absolute difference.
The model is imported into a temporary cache directory first (first-use import time reported).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "embed"))

from sentences import SENTENCES  # noqa: E402

from meshd.embed import Embedder, default_embedding_model, load_embedder  # noqa: E402
from meshd.embed.package import packaged_zip  # noqa: E402
from meshd.embed.reference import encode_reference  # noqa: E402

SOURCE = ("the node forwards each request to the peer with the best predicted time to first "
         "token while gossip spreads signed adverts of load and capability across every region "
         "of the mesh so that routers can decide locally without asking anyone else")
WORDS = SOURCE.split()


def sentence_of(emb: Embedder, tokens: int) -> str:
    """A plain English sentence that tokenizes to exactly ``tokens`` ids (specials included)."""
    for n in range(1, len(WORDS) + 1):
        text = " ".join(WORDS[:n]) + "."
        if len(emb.token_ids([text])[0]) == tokens:
            return text
    raise SystemExit(f"no sentence of {tokens} tokens")


def batch_texts(emb: Embedder, rng: np.random.Generator) -> list[str]:
    out = []
    for _ in range(64):
        k = int(rng.integers(6, 58))
        start = int(rng.integers(0, len(WORDS) - 1))
        words = (WORDS * 3)[start:start + k]
        out.append(" ".join(words).capitalize() + "?")
    return out


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(xs, q))


def reference_check(emb: Embedder) -> dict[str, float]:
    from safetensors.numpy import load_file
    from threadpoolctl import threadpool_limits

    with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(packaged_zip()[0]) as zf:
        zf.extract("model.safetensors", tmp)
        weights = load_file(str(Path(tmp) / "model.safetensors"))
    got = emb.embed(SENTENCES)
    with threadpool_limits(1):
        want = encode_reference(weights, emb.manifest.arch, emb.token_ids(SENTENCES))
    return {"sentences": len(SENTENCES),
            "max_one_minus_cosine": float(np.max(np.abs(1 - np.sum(got * want, axis=1)))),
            "max_abs_diff": float(np.max(np.abs(got - want)))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=300, help="single-sentence runs per setting")
    ap.add_argument("--batch-repeats", type=int, default=30, help="64-sentence batches per setting")
    ap.add_argument("--threads", default="1,2", help="intra-op thread counts, comma separated")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as cache:
        t0 = time.perf_counter()
        model_dir = default_embedding_model(cache_dir=Path(cache))
        import_s = time.perf_counter() - t0
        threads = [int(t) for t in args.threads.split(",")]
        t0 = time.perf_counter()
        embedders = {t: load_embedder(model_dir, threads=t) for t in threads}
        load_s = (time.perf_counter() - t0) / len(threads)
        first = embedders[threads[0]]
        text32 = sentence_of(first, 32)
        batch = batch_texts(first, np.random.default_rng(0))
        lengths = [len(i) for i in first.token_ids(batch)]
        for e in embedders.values():  # warm up
            for _ in range(10):
                e.embed([text32])
            e.embed(batch)
        load0 = os.getloadavg()
        single: dict[int, tuple[list[float], list[float]]] = {t: ([], []) for t in threads}
        for _ in range(args.repeats):
            for t, e in embedders.items():
                w, c = time.perf_counter(), time.process_time()
                e.embed([text32])
                single[t][0].append(time.perf_counter() - w)
                single[t][1].append(time.process_time() - c)
        batched: dict[int, list[float]] = {t: [] for t in threads}
        for _ in range(args.batch_repeats):
            for t, e in embedders.items():
                w = time.perf_counter()
                e.embed(batch)
                batched[t].append(time.perf_counter() - w)
        load1 = os.getloadavg()
        check = reference_check(first)

    result: dict[str, Any] = {
        "onnxruntime": ort.__version__, "cpu": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(), "loadavg_1min_before_after": [load0[0], load1[0]],
        "first_use_import_s": round(import_s, 2), "load_s": round(load_s, 3),
        "sentence_32_tokens": text32, "batch_tokens_min_median_max":
            [min(lengths), int(np.median(lengths)), max(lengths)],
        "settings": {}, "reference": check,
    }
    for t in threads:
        w, c = single[t]
        b = batched[t]
        result["settings"][f"threads={t}"] = {
            "one_32_token_sentence_ms": {"p50": round(pct(w, 50) * 1e3, 2),
                                          "p99": round(pct(w, 99) * 1e3, 2),
                                          "cpu_p50": round(pct(c, 50) * 1e3, 2),
                                          "min": round(min(w) * 1e3, 2)},
            "batch_of_64_ms": {"p50": round(pct(b, 50) * 1e3, 1), "p99": round(pct(b, 99) * 1e3, 1),
                               "sentences_per_s_at_p50": round(64 / pct(b, 50), 1)},
        }
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
