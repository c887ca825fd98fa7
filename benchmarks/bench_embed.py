"""Sentence-embedding figures of all-MiniLM-L6-v2 on onnxruntime (meshd.embed).

    .venv/bin/python benchmarks/bench_embed.py [--repeats 300] [--threads 1,2] [--out FILE.json]

Settings, measured in the same process and interleaved so that a noisy machine slows every
setting alike: for each onnxruntime intra-op thread count (inter-op 1, sequential execution,
ORT_ENABLE_ALL, no spin-waiting: the Embedder's defaults) the float graph (``fp32``) and the
int8 graph (``int8``, meshd.embed.quantize), plus ``fp32-batch-path``: the float graph through
the padded-batch path every call took before the one-text path (``embed_ids(token_ids(...))``,
the baseline).

- (``--block N``: each setting N calls in a row at a time, after two untimed ones, instead of
  one call per setting in turn: the figure of a process holding one embedder, whose weights
  stay in the caches between calls; the default alternation makes each call reload them.)
- one sentence of exactly 32 tokens (special tokens included) and one of 12, through
  ``Embedder.embed`` (tokenization included): p50 and p99 wall time, p50 CPU time of the
  process (less noisy than wall time on a shared box) and the best run;
- the first call after loading without the warm-up run (``warm=False``) and the second one;
- batches of 64 varied sentences (8 to 60 tokens): p50 and p99 wall time per batch, and
  sentences/s at the p50.

With more than one thread, each graph is also timed as ``... spin=off``: the embedder's
``spin=False`` (no spinning twin session), which was the default before ``spin="auto"``
(meshd.core.spin); the plain setting is the default, ``spin="auto"``. ``--spin off`` times only
``spin=False`` (the names then carry no suffix).

With ``--baseline-model DIR`` the graphs of another imported directory (say one written by an
older meshd, before the residual LayerNorms were unfused) are timed alongside, as
``fp32-baseline`` and ``int8-baseline``.

Accuracy: the 50 sentences of tests/embed/sentences.py against the NumPy reference (float64,
one sentence at a time): the largest 1 - cosine and absolute difference, for the float graph;
for the int8 graph the cosine to the float vectors (min, mean) and, on the 544 labelled pairs
of benchmarks/data/cache_pairs.jsonl, the change of each pair's similarity and which pairs
reach the cache's cosine gate (paraphrases and near misses that the verifier would be asked
about) at the gate and near it, for both graphs. The model is imported into a temporary cache directory first
(first-use import time, int8 quantization included, reported).
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
from meshd.embed.manifest import read_embed_manifest  # noqa: E402
from meshd.embed.package import packaged_zip  # noqa: E402
from meshd.embed.reference import encode_reference  # noqa: E402

SOURCE = ("the node forwards each request to the peer with the best predicted time to first "
         "token while gossip spreads signed adverts of load and capability across every region "
         "of the mesh so that routers can decide locally without asking anyone else")
WORDS = SOURCE.split()
BLOCK_WARM = 2  # untimed calls before each timed block (--block > 1)


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


def pair_quality(fp32: Embedder, int8: Embedder) -> dict[str, Any]:
    """Which labelled pairs reach the cache's cosine gate under each graph."""
    from bench_cache import PAIRS, pair_rates

    rows = [json.loads(line) for line in PAIRS.read_text().splitlines() if line.strip()]
    texts = sorted({r["a"] for r in rows} | {r["b"] for r in rows})
    same = np.array([bool(r["same"]) for r in rows])
    sims = {}
    for name, emb in (("fp32", fp32), ("int8", int8)):
        vec = dict(zip(texts, emb.embed(texts), strict=True))
        sims[name] = np.array([float(vec[r["a"]] @ vec[r["b"]]) for r in rows])
    d = np.abs(sims["int8"] - sims["fp32"])
    out: dict[str, Any] = {"pairs": len(rows), "abs_similarity_change_p50_p99_max":
                           [round(float(np.percentile(d, q)), 4) for q in (50, 99, 100)]}
    for name, sim in sims.items():
        out[name] = {f"{t:.2f}": {k: round(v, 4) for k, v in pair_rates(sim >= t, same).items()}
                     for t in (0.77, 0.78, 0.79, 0.80, 0.81)}
    return out


def first_calls(model_dir: Path, precision: str, text: str) -> dict[str, float]:
    emb = load_embedder(model_dir, precision=precision, warm=False)
    out = {}
    for key in ("first_ms", "second_ms"):
        t = time.perf_counter()
        emb.embed([text])
        out[key] = round((time.perf_counter() - t) * 1e3, 2)
    return out


def op_profile(model_dir: Path, precision: str, threads: int, text: str, runs: int = 200
               ) -> dict[str, Any]:
    """onnxruntime's per-operator profile of one text through ``precision``'s graph: median
    kernel time per run of each operator type (ms), and the median session run."""
    import collections

    from meshd.embed.embedder import open_session

    emb = load_embedder(model_dir, threads=threads, precision=precision, warm=False)
    m = emb.manifest
    graph = model_dir / (m.int8_file if precision == "int8" else m.graph_file)
    with tempfile.TemporaryDirectory() as tmp:
        sess = open_session(graph, threads=threads, profile_prefix=str(Path(tmp) / "prof"))
        ids = np.array([emb.token_ids([text])[0]], np.int64)
        feed = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
        for _ in range(20):
            sess.run(None, feed)
        cpu = []
        for _ in range(runs):
            c = time.process_time()
            sess.run(None, feed)
            cpu.append(time.process_time() - c)
        events = json.loads(Path(sess.end_profiling()).read_text())
    per: dict[str, list[float]] = collections.defaultdict(list)
    run_us = [e["dur"] for e in events if e.get("name") == "model_run"]
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            per[e["args"]["op_name"]].append(e["dur"])
    n = len(run_us)
    ops = {k: round(float(np.median(v)) * len(v) / n / 1e3, 3) for k, v in per.items()}
    return {"session_run_ms_p50": round(float(np.median(run_us)) / 1e3, 3),
            "cpu_ms_p50": round(pct(cpu, 50) * 1e3, 3),
            "ops_ms": dict(sorted(ops.items(), key=lambda kv: -kv[1]))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=300, help="single-sentence runs per setting")
    ap.add_argument("--batch-repeats", type=int, default=10, help="64-sentence batches per setting")
    ap.add_argument("--threads", default="1,2", help="intra-op thread counts, comma separated")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--block", type=int, default=1,
                    help="time each setting in runs of this many consecutive calls (after "
                         f"{BLOCK_WARM} untimed ones), settings taking turns; default 1: the "
                         "settings alternate call by call, and each call finds the caches "
                         "full of the other settings' weights (the int8 weights alone are "
                         "~11 MB a session, the shared L3 32 MB)")
    ap.add_argument("--precisions", default="fp32,int8",
                    help="graphs to time, comma separated (default: fp32,int8)")
    ap.add_argument("--spin", default="auto,off",
                    help="embedder spin modes to time with >1 thread, comma separated: auto, "
                         "off, or auto,off for both (the default; 'off' then gets the suffix "
                         "' spin=off')")
    ap.add_argument("--model", type=Path, default=None, metavar="DIR",
                    help="an imported model directory (default: import into a temporary cache)")
    ap.add_argument("--baseline-model", type=Path, default=None, metavar="DIR",
                    help="also time this directory's graphs (e.g. one imported by an older "
                         "meshd) as the settings 'fp32-baseline' and 'int8-baseline'")
    ap.add_argument("--timing-only", action="store_true",
                    help="skip the accuracy checks (reference, int8 vs float, pairs)")
    ap.add_argument("--profile", action="store_true",
                    help="only print onnxruntime's per-operator profile (32 tokens, each graph "
                         "and thread count)")
    args = ap.parse_args()
    if not args.spin or not set(args.spin.split(",")) <= {"auto", "off"}:
        ap.error(f"--spin {args.spin!r}: give auto, off or auto,off")
    if args.profile:
        model_dir = args.model or default_embedding_model()
        text = sentence_of(load_embedder(model_dir, warm=False), 32)
        prof = {"loadavg_1min": os.getloadavg()[0]}
        for t in (int(x) for x in args.threads.split(",")):
            for precision in ("int8", "fp32"):
                prof[f"{precision} threads={t}"] = op_profile(model_dir, precision, t, text)
        prof["loadavg_1min_end"] = os.getloadavg()[0]
        print(json.dumps(prof, indent=1))
        if args.out:
            args.out.write_text(json.dumps(prof, indent=1) + "\n")
        return

    with tempfile.TemporaryDirectory() as cache:
        t0 = time.perf_counter()
        model_dir = args.model or default_embedding_model(cache_dir=Path(cache))
        import_s = time.perf_counter() - t0
        threads = [int(t) for t in args.threads.split(",")]
        t0 = time.perf_counter()
        embedders: dict[str, Embedder] = {}
        modes = args.spin.split(",")
        spins: dict[str, bool | str] = {"": "auto" if "auto" in modes else False}
        if "auto" in modes and "off" in modes:
            spins[" spin=off"] = False
        for t in threads:
            for precision in args.precisions.split(","):
                for suffix, spin in spins.items():
                    if t == 1 and suffix:
                        continue  # one thread: no twin session, "auto" is "off"
                    embedders[f"{precision} threads={t}{suffix}"] = load_embedder(
                        model_dir, threads=t, precision=precision, spin=spin)
                    if args.baseline_model:
                        embedders[f"{precision}-baseline threads={t}{suffix}"] = load_embedder(
                            args.baseline_model, threads=t, precision=precision, spin=spin)
        load_s = (time.perf_counter() - t0) / len(embedders)
        int8_files = {"model": read_embed_manifest(model_dir).int8_scheme}
        if args.baseline_model:
            int8_files["baseline"] = read_embed_manifest(args.baseline_model).int8_scheme
        first = next(iter(embedders.values()))
        text32, text12 = sentence_of(first, 32), sentence_of(first, 12)
        batch = batch_texts(first, np.random.default_rng(0))
        lengths = [len(i) for i in first.token_ids(batch)]
        calls: dict[str, Any] = {}
        for name, e in embedders.items():
            calls[name] = lambda text, e=e: e.embed([text])
            if name.startswith("fp32 ") and "spin=" not in name:  # the padded-batch path every call took before
                calls[name.replace("fp32", "fp32-batch-path")] = (
                    lambda text, e=e: e.embed_ids(e.token_ids([text])))
        for f in calls.values():  # warm up
            for _ in range(10):
                f(text32)
        for e in embedders.values():
            e.embed(batch)
        load0 = os.getloadavg()
        single: dict[str, dict[int, tuple[list[float], list[float]]]] = {
            name: {32: ([], []), 12: ([], [])} for name in calls}
        block = max(args.block, 1)
        for _ in range(-(-args.repeats // block)):
            for tokens, text in ((32, text32), (12, text12)):
                for name, f in calls.items():
                    for _ in range(BLOCK_WARM if block > 1 else 0):
                        f(text)  # this setting's weights back into the caches
                    for _ in range(block):
                        w, c = time.perf_counter(), time.process_time()
                        f(text)
                        single[name][tokens][0].append(time.perf_counter() - w)
                        single[name][tokens][1].append(time.process_time() - c)
        batched: dict[str, list[float]] = {name: [] for name in embedders}
        for _ in range(args.batch_repeats):
            for name, e in embedders.items():
                w = time.perf_counter()
                e.embed(batch)
                batched[name].append(time.perf_counter() - w)
        load1 = os.getloadavg()
        cold = {p: first_calls(model_dir, p, text32) for p in ("fp32", "int8")}
        sizes = {p.name: p.stat().st_size for p in model_dir.iterdir()}
    check: dict[str, Any] = {}
    quality: dict[str, Any] = {}
    if not args.timing_only:
        check = reference_check(first)
        first = embedders[f"fp32 threads={threads[0]}"]
        int8 = embedders[f"int8 threads={threads[0]}"]
        a, b = first.embed(SENTENCES), int8.embed(SENTENCES)
        cos = np.sum(a * b, axis=1)
        check["int8_cosine_to_fp32_min_mean"] = [round(float(cos.min()), 4),
                                                 round(float(cos.mean()), 4)]
        quality = pair_quality(first, int8)

    result: dict[str, Any] = {
        "onnxruntime": ort.__version__, "cpu": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(), "loadavg_1min_before_after": [load0[0], load1[0]],
        "first_use_import_s": round(import_s, 2), "load_s": round(load_s, 3),
        "int8_schemes": int8_files,
        "file_bytes": sizes, "sentence_32_tokens": text32, "sentence_12_tokens": text12,
        "batch_tokens_min_median_max": [min(lengths), int(np.median(lengths)), max(lengths)],
        "block": args.block, "settings": {}, "spin_runs": {n: e.statistics()["spin_runs"]
                                      for n, e in embedders.items()},
        "first_call_without_warmup": cold, "reference": check,
        "int8_on_cache_pairs": quality,
    }
    for name in calls:
        row: dict[str, Any] = {}
        for tokens in (32, 12):
            w, c = single[name][tokens]
            row[f"one_{tokens}_token_sentence_ms"] = {
                "p50": round(pct(w, 50) * 1e3, 2), "p99": round(pct(w, 99) * 1e3, 2),
                "cpu_p50": round(pct(c, 50) * 1e3, 2), "min": round(min(w) * 1e3, 2)}
        if name in batched:
            b = batched[name]
            row["batch_of_64_ms"] = {"p50": round(pct(b, 50) * 1e3, 1),
                                     "p99": round(pct(b, 99) * 1e3, 1),
                                     "sentences_per_s_at_p50": round(64 / pct(b, 50), 1)}
        result["settings"][name] = row
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    print(summary(result), file=sys.stderr)


def summary(result: dict[str, Any]) -> str:
    """One line per setting: 32 and 12 tokens p50 / p99 / CPU p50 / best, ratio to the base."""
    settings = result["settings"]
    base_name = next((n for n in settings if n.startswith("fp32-batch-path")), next(iter(settings)))
    base = settings[base_name]["one_32_token_sentence_ms"]
    lines = [f"load average {result['loadavg_1min_before_after']}; baseline {base_name}",
             f"{'setting':28s} {'32 tok p50/p99/cpu/min ms':>28s} {'x base(cpu)':>11s} "
             f"{'12 tok p50/cpu ms':>18s} {'batch64 s/s':>11s} {'32 tok p50 x spin=off':>21s}"]
    for name, row in settings.items():
        r32, r12 = row["one_32_token_sentence_ms"], row["one_12_token_sentence_ms"]
        rate = row.get("batch_of_64_ms", {}).get("sentences_per_s_at_p50", "")
        off = settings.get(name + " spin=off")
        vs_off = (f"{r32['p50'] / off['one_32_token_sentence_ms']['p50']:.3f}" if off else "")
        lines.append(f"{name:28s} {r32['p50']:7.2f}/{r32['p99']:6.1f}/{r32['cpu_p50']:6.2f}/"
                     f"{r32['min']:6.2f} {base['cpu_p50'] / r32['cpu_p50']:11.2f} "
                     f"{r12['p50']:9.2f}/{r12['cpu_p50']:6.2f} {rate!s:>11s} {vs_off:>21s}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
