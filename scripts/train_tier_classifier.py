"""Train the tier classifier (docs/tiers.md) and write it as ONNX into the package data.

    PYTHONPATH=. .venv/bin/python scripts/train_tier_classifier.py [--data FILE] [--extra FILE]
                                                                   [--out DIR]

Dev-only; numpy and onnx.helper only (no torch). Reads benchmarks/data/tier_prompts.jsonl
(made by benchmarks/data/make_tier_prompts.py: each prompt labelled ``simple`` or ``complex``,
with its ``split``: one template in five of every generator family is held out whole) and the
training-only rows of benchmarks/data/tier_prompts_extra.jsonl (``--extra``; made by
benchmarks/data/make_tier_extra.py, which says why), embeds
every prompt with meshd's sentence encoder (all-MiniLM-L6-v2, ``meshd.embed.load_embedder``),
adds the cheap features (``meshd.core.prompt_features``), and fits a tiny MLP (one hidden ReLU layer of 32),
P(complex) = sigmoid(w2 . relu(W1 [embedding, standardised features] + b1) + b2), with L2 regularisation chosen
by cross-validation over the *training* templates (grouped, so a template never sits in both
parts). The decision threshold is chosen the same way (on the training folds' predictions, never
on the held-out set): the lowest-cost threshold that sends at most ``--max-complex-down`` of the
complex prompts down.

Writes ``<out>/complexity-v1.onnx`` (input ``x`` float32 [N, 398], output ``p_complex`` [N, 1];
the standardisation is inside the graph) and ``<out>/complexity-v1.json`` (feature names, the
embedding model, threshold, held-out accuracy, confusion matrix, the threshold curve, and the
held-out scores per class, which the simulator samples), and docs/results/tier-classifier.txt.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from meshd.core.prompt_features import FEATURE_NAMES, prompt_features  # noqa: E402

DATA = ROOT / "benchmarks" / "data" / "tier_prompts.jsonl"
EXTRA = ROOT / "benchmarks" / "data" / "tier_prompts_extra.jsonl"
OUT = ROOT / "meshd" / "data" / "classifier"
RESULTS = ROOT / "docs" / "results" / "tier-classifier.txt"
NAME = "complexity-v1"
HIDDEN = 32


def load(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def embed_all(texts: list[str], cache: Path) -> np.ndarray:
    from meshd.embed import load_embedder

    key = hashlib.sha256("\0".join(texts).encode()).hexdigest()[:16]
    f = cache / f"tier-emb-{key}.npy"
    if f.exists():
        return np.load(f)
    emb = load_embedder()
    t0 = time.perf_counter()
    out = emb.embed(texts).astype(np.float32)
    print(f"embedded {len(texts)} prompts in {time.perf_counter() - t0:.1f} s ({emb.identity})")
    cache.mkdir(parents=True, exist_ok=True)
    np.save(f, out)
    return out


Params = dict[str, np.ndarray]


def fit(x: np.ndarray, y: np.ndarray, l2: float, hidden: int = HIDDEN, steps: int = 800,
        seed: int = 0) -> Params:
    """A one-hidden-layer MLP (ReLU, sigmoid output) by full-batch Adam on the class-balanced
    log loss with L2 on the weights."""
    rng = np.random.default_rng(seed)
    prm: Params = {"w1": rng.normal(0, 0.1, (x.shape[1], hidden)), "b1": np.zeros(hidden),
                   "w2": rng.normal(0, 0.1, hidden), "b2": np.zeros(1)}
    m = {k: np.zeros_like(v) for k, v in prm.items()}
    v2 = {k: np.zeros_like(v) for k, v in prm.items()}
    n, pos = len(y), y.mean()
    sw = np.where(y == 1, 0.5 / pos, 0.5 / (1 - pos))
    for t in range(1, steps + 1):
        h = np.maximum(x @ prm["w1"] + prm["b1"], 0.0)
        p = 1.0 / (1.0 + np.exp(-(h @ prm["w2"] + prm["b2"][0])))
        g = sw * (p - y) / n
        gh = np.outer(g, prm["w2"]) * (h > 0)
        grads = {"w1": x.T @ gh + l2 * prm["w1"], "b1": gh.sum(0),
                 "w2": h.T @ g + l2 * prm["w2"], "b2": np.array([g.sum()])}
        for k, gr in grads.items():
            m[k] = 0.9 * m[k] + 0.1 * gr
            v2[k] = 0.999 * v2[k] + 0.001 * gr * gr
            prm[k] -= 0.01 * (m[k] / (1 - 0.9**t)) / (np.sqrt(v2[k] / (1 - 0.999**t)) + 1e-8)
    return prm


def predict(x: np.ndarray, prm: Params) -> np.ndarray:
    h = np.maximum(x @ prm["w1"] + prm["b1"], 0.0)
    return 1.0 / (1.0 + np.exp(-(h @ prm["w2"] + prm["b2"][0])))


def cv_scores(x: np.ndarray, y: np.ndarray, groups: list[str], l2: float, k: int = 5) -> np.ndarray:
    uniq = sorted(set(groups))
    fold = {g: i % k for i, g in enumerate(uniq)}
    f = np.array([fold[g] for g in groups])
    out = np.zeros(len(y))
    for i in range(k):
        out[f == i] = predict(x[f == i], fit(x[f != i], y[f != i], l2, steps=400))
    return out


def curve(p: np.ndarray, y: np.ndarray, cost_micro: float, cost_large: float) -> list[dict[str, float]]:
    """At each threshold: accuracy, the share sent to the large tier, the share of complex prompts
    sent down (quality loss), and the relative cost (all-to-large = 1)."""
    rows = []
    for t in np.round(np.arange(0.05, 0.96, 0.05), 2):
        big = p >= t
        rows.append({
            "threshold": float(t),
            "accuracy": float((big == (y == 1)).mean()),
            "to_large": float(big.mean()),
            "complex_down": float((~big[y == 1]).mean()),
            "simple_up": float(big[y == 0].mean()),
            "relative_cost": float((big.mean() * cost_large + (~big).mean() * cost_micro) / cost_large),
        })
    return rows


def pick_threshold(p: np.ndarray, y: np.ndarray, max_down: float) -> float:
    best = 0.5
    for t in np.round(np.arange(0.95, 0.04, -0.01), 2):  # highest threshold (cheapest) that keeps quality
        if (p[y == 1] < t).mean() <= max_down:
            best = float(t)
            break
    return best


def to_onnx(prm: Params, mean: np.ndarray, scale: np.ndarray) -> onnx.ModelProto:
    d, h = prm["w1"].shape
    f32 = np.float32
    inits = [
        numpy_helper.from_array(mean.astype(f32), "mean"),
        numpy_helper.from_array((1.0 / scale).astype(f32), "inv_scale"),
        numpy_helper.from_array(prm["w1"].astype(f32), "w1"),
        numpy_helper.from_array(prm["b1"].astype(f32), "b1"),
        numpy_helper.from_array(prm["w2"].reshape(h, 1).astype(f32), "w2"),
        numpy_helper.from_array(prm["b2"].astype(f32), "b2"),
    ]
    nodes = [
        helper.make_node("Sub", ["x", "mean"], ["centred"]),
        helper.make_node("Mul", ["centred", "inv_scale"], ["z"]),
        helper.make_node("MatMul", ["z", "w1"], ["h0"]),
        helper.make_node("Add", ["h0", "b1"], ["h1"]),
        helper.make_node("Relu", ["h1"], ["h"]),
        helper.make_node("MatMul", ["h", "w2"], ["logit0"]),
        helper.make_node("Add", ["logit0", "b2"], ["logit"]),
        helper.make_node("Sigmoid", ["logit"], ["p_complex"]),
    ]
    graph = helper.make_graph(
        nodes, "meshd-tier-classifier",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", d])],
        [helper.make_tensor_value_info("p_complex", TensorProto.FLOAT, ["n", 1])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              producer_name="meshd scripts/train_tier_classifier.py")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--extra", type=Path, default=EXTRA,
                    help="training-only rows added to --data's training split ('' for none)")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--cache", type=Path, default=Path("/tmp/meshd-tier-train"))
    ap.add_argument("--max-complex-down", type=float, default=0.03,
                    help="threshold choice: at most this share of complex prompts sent down (train CV)")
    ap.add_argument("--cost-micro", type=float, default=0.05, help="relative price of a micro answer")
    args = ap.parse_args(argv)

    rows = load(args.data)
    extra = load(args.extra) if str(args.extra) not in ("", ".") else []
    if any(r["split"] != "train" for r in extra):
        raise SystemExit(f"{args.extra}: every row must have split = train")
    held = {r["text"] for r in rows if r["split"] != "train"}
    if any(r["text"] in held for r in extra):
        raise SystemExit(f"{args.extra}: holds a prompt of the held-out split")
    emb = embed_all([r["text"] for r in rows], args.cache)  # cached per file
    if extra:
        emb = np.concatenate([emb, embed_all([r["text"] for r in extra], args.cache)])
    rows = rows + extra
    texts = [r["text"] for r in rows]
    y = np.array([1.0 if r["label"] == "complex" else 0.0 for r in rows])
    train = np.array([r["split"] == "train" for r in rows])
    feats = np.array([prompt_features(t).values for t in texts], dtype=np.float64)
    x = np.concatenate([emb.astype(np.float64), feats], axis=1)
    mean = np.zeros(x.shape[1])
    scale = np.ones(x.shape[1])
    k = emb.shape[1]
    mean[k:] = feats[train].mean(axis=0)
    scale[k:] = feats[train].std(axis=0) + 1e-6
    z = (x - mean) / scale
    groups = [r["template"] for r, t in zip(rows, train, strict=True) if t]

    cv: dict[float, float] = {}
    cv_p: dict[float, np.ndarray] = {}
    for l2 in (1e-3, 1e-2):
        p = cv_scores(z[train], y[train], groups, l2)
        cv_p[l2] = p
        cv[l2] = float(((p >= 0.5) == (y[train] == 1)).mean())
        print(f"cv l2={l2:g} accuracy@0.5={cv[l2]:.3f}")
    l2 = max(cv, key=lambda a: (cv[a], -a))
    threshold = pick_threshold(cv_p[l2], y[train], args.max_complex_down)
    prm = fit(z[train], y[train], l2)
    p_test = predict(z[~train], prm)
    y_test = y[~train]
    big = p_test >= threshold
    cm = {"simple_as_simple": int(((~big) & (y_test == 0)).sum()),
          "simple_as_complex": int((big & (y_test == 0)).sum()),
          "complex_as_simple": int(((~big) & (y_test == 1)).sum()),
          "complex_as_complex": int((big & (y_test == 1)).sum())}
    acc = float((big == (y_test == 1)).mean())
    acc05 = float(((p_test >= 0.5) == (y_test == 1)).mean())
    fam_acc: dict[str, float] = {}
    test_rows = [r for r, t in zip(rows, train, strict=True) if not t]
    for fam in sorted({r["family"] for r in test_rows}):
        ix = np.array([r["family"] == fam for r in test_rows])
        fam_acc[fam] = round(float((big[ix] == (y_test[ix] == 1)).mean()), 3)
    meta = {
        "name": NAME, "kind": f"mlp-{HIDDEN}", "input": "x", "output": "p_complex",
        "embedding": "all-minilm-l6-v2", "embedding_dim": int(k), "features": list(FEATURE_NAMES),
        "threshold": threshold, "l2": l2, "cv_accuracy_at_0.5": cv,
        "data": {"file": _rel(args.data),
                 "sha256": hashlib.sha256(args.data.read_bytes()).hexdigest(),
                 "train": int(train.sum()), "test": int((~train).sum()),
                 "extra": ({"file": _rel(args.extra), "sha256": hashlib.sha256(args.extra.read_bytes()).hexdigest(),
                            "rows": len(extra)} if extra else None)},
        "heldout": {"accuracy": round(acc, 4), "accuracy_at_0.5": round(acc05, 4),
                    "confusion": cm,
                    "complex_down": round(cm["complex_as_simple"] / max(1, int((y_test == 1).sum())), 4),
                    "simple_up": round(cm["simple_as_complex"] / max(1, int((y_test == 0).sum())), 4),
                    "by_family": fam_acc,
                    "curve": curve(p_test, y_test, args.cost_micro, 1.0),
                    "scores": {"simple": [round(float(s), 3) for s in p_test[y_test == 0]],
                               "complex": [round(float(s), 3) for s in p_test[y_test == 1]]}},
    }
    args.out.mkdir(parents=True, exist_ok=True)
    onnx.save(to_onnx(prm, mean, scale), str(args.out / f"{NAME}.onnx"))
    (args.out / f"{NAME}.json").write_text(json.dumps(meta, indent=1) + "\n")
    report = render(meta)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(report)
    print(report)
    return 0


def _rel(path: Path) -> str:
    path = path.resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def render(meta: dict[str, Any]) -> str:
    h = meta["heldout"]
    cm = h["confusion"]
    lines = [
        f"tier classifier {meta['name']}: {meta['kind']} (one ReLU layer) over {meta['embedding']} "
        f"({meta['embedding_dim']}-d) + {len(meta['features'])} cheap features; l2={meta['l2']:g}",
        f"data {meta['data']['file']} sha256={meta['data']['sha256'][:16]} "
        f"train={meta['data']['train']} held-out={meta['data']['test']} (templates held out whole)"
        + (f"; train includes {meta['data']['extra']['rows']} rows of {meta['data']['extra']['file']} "
           f"sha256={meta['data']['extra']['sha256'][:16]}" if meta["data"].get("extra") else ""),
        f"threshold {meta['threshold']:.2f} (chosen on training-fold predictions)",
        f"held-out accuracy {h['accuracy']:.3f} at the threshold, {h['accuracy_at_0.5']:.3f} at 0.5",
        "confusion (rows: truth; columns: predicted simple, complex)",
        f"  simple   {cm['simple_as_simple']:5d} {cm['simple_as_complex']:5d}",
        f"  complex  {cm['complex_as_simple']:5d} {cm['complex_as_complex']:5d}",
        f"complex sent down {h['complex_down']:.3f}; simple sent up {h['simple_up']:.3f}",
        "threshold  accuracy  to_large  complex_down  simple_up  relative_cost",
    ]
    for r in h["curve"]:
        lines.append(f"  {r['threshold']:.2f}     {r['accuracy']:.3f}     {r['to_large']:.3f}     "
                     f"{r['complex_down']:.3f}        {r['simple_up']:.3f}      {r['relative_cost']:.3f}")
    lines.append("held-out accuracy by family: " + ", ".join(f"{k} {v:.2f}" for k, v in h["by_family"].items()))
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
