"""Write the semantic cache's calibration: the pair verifier's score of every labelled near miss
of the calibration splits that reaches the cosine gate (docs/cache.md, "The error bound").

    .venv/bin/python scripts/calibrate_cache.py            # rewrites the file, deterministic

The calibration splits (benchmarks/data/README.md) were never used to train the verifier
(``pair-verifier-v1`` was trained on ``tune``, ``test``, ``fresh``, ``fresh2``, ``fresh3`` and
``train2``) nor to choose anything else; ``fresh4``, ``fresh5`` and ``fresh6`` stay held out.
Each pair's anchor is the cached prompt and the other prompt the lookup, as in the daemon: the
cosine of their int8 embeddings (the daemon's default graph) must reach ``GATE`` for the
verifier to be asked, and the verifier reads ``(cached, query)``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from meshd.cache.bound import Calibration, threshold  # noqa: E402
from meshd.embed import default_embedding_model, load_embedder  # noqa: E402
from meshd.embed.pair_verifier import PairVerifier, shipped_verifier  # noqa: E402

DATA = ROOT / "benchmarks" / "data"
SPLITS = ("train3a", "train3b", "train3c", "train4a", "train4b")
GATE = 0.79  # cosine from which the verifier is asked (docs/cache.md: chosen on the dev splits)
CONFIDENCE = 0.95
OUT = shipped_verifier().with_name(shipped_verifier().stem + "-calibration.json")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    rows = []
    for split in SPLITS:
        rows += [json.loads(line) for line in
                 (DATA / f"cache_pairs_{split}.jsonl").read_text().splitlines()]
    model = default_embedding_model()
    emb = load_embedder(model, precision="int8")
    pv = PairVerifier(None, model, threads=1)
    texts = sorted({r["a"] for r in rows} | {r["b"] for r in rows})
    vec = {}
    for i in range(0, len(texts), 64):
        chunk = texts[i:i + 64]
        vec.update(zip(chunk, emb.embed(chunk), strict=True))
    near = [r for r in rows if not r["same"]]
    scores = sorted((round(pv.probability(r["a"], r["b"]), 6) for r in near
                     if float(vec[r["a"]] @ vec[r["b"]]) >= GATE), reverse=True)
    cal = Calibration(GATE, len(near), tuple(scores), CONFIDENCE, pv.info.name)
    out = {
        "verifier": pv.info.name, "embedding": emb.identity, "embedding_precision": "int8",
        "splits": list(SPLITS), "gate": GATE, "confidence": CONFIDENCE,
        "near_misses": len(near), "paraphrases": len(rows) - len(near),
        "thresholds": {str(e): threshold(cal, e) for e in (0.005, 0.01, 0.02, 0.05)},
        "scores": scores,
    }
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(f"{len(near)} near misses, {len(scores)} reach the gate {GATE}; thresholds "
          f"{out['thresholds']} -> {args.out}")


if __name__ == "__main__":
    main()
