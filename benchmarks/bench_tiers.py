"""What the tier classifier adds to a request at the entry node (issue 16; docs/tiers.md).

    PYTHONPATH=. .venv/bin/python benchmarks/bench_tiers.py [--n 300] [--out FILE.json]

For held-out prompts of benchmarks/data/tier_prompts.jsonl, one at a time as the entry node
does: the sentence embedding alone (the baseline, ``Embedder.embed([text])``), then the
classifier alone on that embedding (``TierClassifier.score``: the cheap features and one
onnxruntime run), then both. Prints medians and p99, and the classifier's p50 as a ratio of the
embedding's. Goal: the classifier adds at most 2 ms p50 beyond the embedding.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

from meshd.classify import load_classifier
from meshd.embed import load_embedder

DATA = Path(__file__).resolve().parent / "data" / "tier_prompts.jsonl"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--threads", type=int, default=1, help="embedding threads (the node's: 1)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    rows = [json.loads(x) for x in DATA.read_text().splitlines() if x]
    texts = [r["text"] for r in rows if r["split"] == "test"][: args.n]
    emb = load_embedder(threads=args.threads)
    clf = load_classifier()
    for t in texts[:10]:  # warm up both sessions
        clf.score(t, emb.embed([t])[0])
    e_ms, c_ms, both_ms = [], [], []
    for t in texts:
        t0 = time.perf_counter()
        v = emb.embed([t])[0]
        t1 = time.perf_counter()
        clf.score(t, v)
        t2 = time.perf_counter()
        e_ms.append((t1 - t0) * 1000)
        c_ms.append((t2 - t1) * 1000)
        both_ms.append((t2 - t0) * 1000)
    out = {}
    for name, xs in (("embedding", e_ms), ("classifier", c_ms), ("both", both_ms)):
        a = np.array(xs)
        out[name] = {"p50_ms": round(float(np.median(a)), 3), "p99_ms": round(float(np.percentile(a, 99)), 3)}
    out["classifier_over_embedding_p50"] = round(out["classifier"]["p50_ms"] / out["embedding"]["p50_ms"], 4)
    out["n"] = len(texts)
    out["loadavg"] = [round(x, 2) for x in os.getloadavg()]
    for k in ("embedding", "classifier", "both"):
        print(f"{k:10s} p50 {out[k]['p50_ms']:8.3f} ms   p99 {out[k]['p99_ms']:8.3f} ms")
    print(f"classifier p50 / embedding p50 = {out['classifier_over_embedding_p50']:.4f}; "
          f"n={out['n']} loadavg={out['loadavg']}")
    if args.out:
        args.out.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
