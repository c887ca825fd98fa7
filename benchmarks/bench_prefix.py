"""Time to first token with the KV prefix cache against without it, side by side (issue 32).

A ``--prompt-tokens`` prompt (2,048) whose first ``--cached-tokens`` (1,920) are in the prefix
cache, against the same prompt with nothing cached, on one model (the real instruct model:
SmolLM2-135M-Instruct Q4_1 imported as ``smol-q41``). Each repeat takes a new prompt (random
token ids of the vocabulary, seeded) and, interleaved:

1. with the cache off (``Model.set_prefix_budget(0)``), serves the prompt: the uncached TTFT;
2. with a fresh cache on, serves its first ``--cached-tokens`` tokens (one token, untimed),
   which keeps their blocks, then serves the whole prompt: the cached TTFT;

and checks that both gave the same greedy tokens. TTFT is from the call to the first token
(the prefix restored, the rest prefilled, the first token sampled). Both engine paths are
timed: ``loop`` (``Model.generate_sync``: the one-sequence loop, 128-token prefill chunks) and
``batch`` (the batch scheduler's steps, calibrated chunks, one prompt at a time). The goal is a
median ratio cached/uncached of at most 0.15.

    .venv/bin/python benchmarks/bench_prefix.py --model DIR --repeats 7 \\
        --out benchmarks/results-prefix.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np

from meshd.engine import GenerationConfig, load_model
from meshd.engine.scheduler import BatchScheduler, prepare

GOAL = 0.15


def _loop(model: Any, ids: list[int], cfg: GenerationConfig) -> tuple[float, list[int]]:
    t0 = time.perf_counter()
    ttft = 0.0
    out: list[int] = []
    for ev in model.generate_sync(ids, cfg):
        if not out:
            ttft = time.perf_counter() - t0
        out.append(ev.token_id)
    return ttft, out


def _batch(sched: BatchScheduler, ids: list[int], cfg: GenerationConfig) -> tuple[float, list[int]]:
    seq = prepare(sched.model, ids, cfg, False)
    t0 = time.perf_counter()
    sched.add(seq)
    ttft = 0.0
    out: list[int] = []
    while sched.busy:
        for s in sched.step():
            if s is seq:
                if not out:
                    ttft = time.perf_counter() - t0
                out += [e.token_id for e in s.events]
                s.events.clear()
    return ttft, out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True,
                    help="a meshd model directory (e.g. meshd model import SmolLM2-135M-Instruct.Q4_1.gguf)")
    ap.add_argument("--prompt-tokens", type=int, default=2048)
    ap.add_argument("--cached-tokens", type=int, default=1920)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=4, help="tokens compared per answer")
    ap.add_argument("--paths", default="loop,batch", help="loop, batch or both")
    ap.add_argument("--budget-mb", type=int, default=512)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if not 0 < args.cached_tokens < args.prompt_tokens:
        ap.error("--cached-tokens must be in (0, --prompt-tokens)")
    paths = [p for p in args.paths.split(",") if p]
    if not paths or any(p not in ("loop", "batch") for p in paths):
        ap.error("--paths takes loop, batch or loop,batch")

    model = load_model(args.model, threads=args.threads or None)
    if args.prompt_tokens + args.max_tokens > model.context_length:
        ap.error(f"the model's context is {model.context_length} tokens")
    cfg = GenerationConfig(max_tokens=args.max_tokens, temperature=0.0, repetition_penalty=1.0)
    one = GenerationConfig(max_tokens=1, temperature=0.0)
    sched = BatchScheduler(model) if "batch" in paths else None
    if sched is not None:
        sched.calibrate()
    rng = np.random.default_rng(args.seed)
    hi = min(model.vocab_size, 49000)
    runs: dict[str, list[dict[str, Any]]] = {p: [] for p in paths}
    _loop(model, [int(i) for i in rng.integers(100, hi, 256)], one)  # first-run costs
    for r in range(args.repeats):
        for path in paths:
            ids = [int(i) for i in rng.integers(100, hi, args.prompt_tokens)]

            def serve(prompt: list[int], c: GenerationConfig,
                      path: str = path) -> tuple[float, list[int]]:
                if path == "loop":
                    return _loop(model, prompt, c)
                assert sched is not None
                return _batch(sched, prompt, c)

            model.set_prefix_budget(0)
            cold, cold_ids = serve(ids, cfg)
            model.set_prefix_budget(args.budget_mb << 20)
            serve(ids[:args.cached_tokens], one)
            warm, warm_ids = serve(ids, cfg)
            px = model.prefix_cache.statistics() if model.prefix_cache is not None else {}
            row = {"repeat": r, "uncached_ttft_ms": round(cold * 1000, 2),
                   "cached_ttft_ms": round(warm * 1000, 2), "ratio": round(warm / cold, 4),
                   "reused_tokens": px.get("reused_tokens", 0), "same_tokens": cold_ids == warm_ids}
            runs[path].append(row)
            print(f"{path:5} repeat {r}: uncached {row['uncached_ttft_ms']:8.1f} ms, cached "
                  f"{row['cached_ttft_ms']:7.1f} ms ({row['reused_tokens']} tokens reused), "
                  f"ratio {row['ratio']:.3f}, same tokens {row['same_tokens']}", flush=True)
    model.set_prefix_budget(0)

    summary: dict[str, Any] = {}
    for path, rows in runs.items():
        cold = statistics.median(x["uncached_ttft_ms"] for x in rows)
        warm = statistics.median(x["cached_ttft_ms"] for x in rows)
        summary[path] = {"uncached_ttft_ms_median": cold, "cached_ttft_ms_median": warm,
                         "ratio_of_medians": round(warm / cold, 4),
                         "ratio_median": statistics.median(x["ratio"] for x in rows),
                         "all_same_tokens": all(x["same_tokens"] for x in rows),
                         "goal": GOAL, "met": warm / cold <= GOAL}
        print(f"{path:5} median TTFT uncached {cold:.1f} ms, cached {warm:.1f} ms: "
              f"{warm / cold:.3f}x (goal <= {GOAL}x: {'met' if warm / cold <= GOAL else 'missed'})"
              f", tokens identical: {summary[path]['all_same_tokens']}")
    if args.out:
        try:
            commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                    text=True, check=False).stdout.strip()
        except OSError:
            commit = ""
        doc = {"benchmark": "prefix", "model": str(args.model), "commit": commit,
               "prompt_tokens": args.prompt_tokens, "cached_tokens": args.cached_tokens,
               "repeats": args.repeats, "provider": model.provider, "cpus": os.cpu_count(),
               "load": os.getloadavg(), "chunk_tokens": sched.chunk() if sched else None,
               "summary": summary, "runs": runs}
        args.out.write_text(json.dumps(doc, indent=1) + "\n")
    return 0 if all(s["all_same_tokens"] for s in summary.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
