"""Continuous batching against today's one-sequence loop, in the same run (docs/benchmarks.md).

For 1, 2, 4, 8, 16 concurrent greedy streams on one model it prints the aggregate decode
tokens/s and the per-stream inter-token latency of (a) the batch scheduler (``Model.batcher``:
one onnxruntime call per step for every running stream) and (b) the one-sequence loop that
``Model.generate`` runs without it (each stream its own decode loop in worker threads under a
limiter of ``--workers``, as the daemon ran before). Then, with ``--running`` streams decoding
in the batch, it admits one ``--admit-tokens`` prompt and reports how long the running streams
stalled: their inter-token gaps while the prompt is prefilled in chunks, against their gaps
before.

Aggregate decode tokens/s is measured in the window where every stream of the run is decoding
(from the last stream's first token to the first stream's last token): tokens in the window
over its length. Prefill is outside it.

    .venv/bin/python scripts/make_bench_model.py --out build/bench-hf
    .venv/bin/python -m meshd model import build/bench-hf --out build/bench-model --dtype fp16
    .venv/bin/python benchmarks/bench_batching.py --model build/bench-model --out FILE.json
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
import trio

from meshd.engine import GenerationConfig, load_model
from meshd.engine.run import generate_async


def _window(times: list[list[float]]) -> dict[str, float]:
    """Aggregate tokens/s and per-stream inter-token latency in the all-decoding window."""
    start = max(t[0] for t in times)
    end = min(t[-1] for t in times)
    count = sum(1 for t in times for x in t if start < x <= end)
    gaps = [b - a for t in times for a, b in zip(t, t[1:], strict=False)
            if start <= a and b <= end]
    if end <= start or not gaps:  # no overlap (one stream): its whole decode
        start, end = times[0][0], times[0][-1]
        count = len(times[0]) - 1
        gaps = [b - a for a, b in zip(times[0], times[0][1:], strict=False)]
    return {"aggregate_tps": count / (end - start), "itl_ms": statistics.median(gaps) * 1000,
            "window_s": end - start, "window_tokens": count}


async def _streams(model: Any, n: int, tokens: int, prompt_len: int, batched: bool,
                   limiter: Any) -> list[list[float]]:
    rng = np.random.default_rng(n)
    cfg = GenerationConfig(max_tokens=tokens, temperature=0.0, repetition_penalty=1.0)
    times: list[list[float]] = [[] for _ in range(n)]

    async def one(i: int) -> None:
        prompt = [int(x) for x in rng.integers(3, model.vocab_size, prompt_len)]
        gen = (model.generate(prompt, cfg) if batched
               else generate_async(model, prompt, cfg, limiter=limiter))
        async for _ in gen:
            times[i].append(time.perf_counter())

    async with trio.open_nursery() as nursery:
        for i in range(n):
            nursery.start_soon(one, i)
    return times


async def _admission(model: Any, running: int, admit: int, batched: bool,
                     limiter: Any) -> dict[str, Any]:
    """Running streams' gaps before and while a long prompt is admitted."""
    cfg = GenerationConfig(max_tokens=100000, temperature=0.0, repetition_penalty=1.0)
    times: list[list[float]] = [[] for _ in range(running)]
    marks: dict[str, float] = {}
    rng = np.random.default_rng(1)

    scopes = [trio.CancelScope() for _ in range(running)]

    async def stream(i: int) -> None:
        with scopes[i]:
            prompt = [int(x) for x in rng.integers(3, model.vocab_size, 8)]
            gen = (model.generate(prompt, cfg) if batched
                   else generate_async(model, prompt, cfg, limiter=limiter))
            async for _ in gen:
                times[i].append(time.perf_counter())

    async with trio.open_nursery() as nursery:
        for i in range(running):
            nursery.start_soon(stream, i)
        while min(len(t) for t in times) < 6:  # all decoding, a few steps in
            await trio.sleep(0.01)
        marks["admit"] = time.perf_counter()
        long = [int(x) for x in rng.integers(3, model.vocab_size, admit)]
        few = GenerationConfig(max_tokens=4, temperature=0.0)
        gen = model.generate(long, few) if batched else generate_async(model, long, few,
                                                                       limiter=limiter)
        async for _ in gen:
            marks["second" if "first" in marks else "first"] = time.perf_counter()
            if "second" in marks:
                break
        n_after = [len(t) for t in times]
        while min(len(t) - k for t, k in zip(times, n_after, strict=True)) < 3:
            await trio.sleep(0.01)
        for scope in scopes:
            scope.cancel()
    a, f, s2 = marks["admit"], marks["first"], marks["second"]
    before = [y - x for t in times for x, y in zip(t, t[1:], strict=False) if y <= a]
    during = [y - x for t in times for x, y in zip(t, t[1:], strict=False) if y > a and x < f]
    joined = [y - x for t in times for x, y in zip(t, t[1:], strict=False) if y > a and x < s2]
    base = statistics.median(before)
    stats = model.statistics().get("batch") or {}
    trace = getattr(getattr(model.batcher, "sched", None), "trace", [])
    window = [(t - a, ms, what) for t, ms, what in trace if a <= t < s2]
    slowest = sorted(window, key=lambda w: -w[1])[:6]
    kinds: dict[str, list[float]] = {}
    for _, ms, what in window:
        kinds.setdefault(what, []).append(ms)
    return {"running": running, "admit_tokens": admit,
            "gap_before_median_ms": base * 1000,
            "gap_during_p50_ms": float(np.percentile(during, 50)) * 1000,
            "gap_during_p99_ms": float(np.percentile(during, 99)) * 1000,
            "gap_during_max_ms": max(during) * 1000,
            "stall_p99_ms": (float(np.percentile(during, 99)) - base) * 1000,
            "stall_max_ms": (max(during) - base) * 1000,
            # the window up to the long prompt's second token: its join into the batch counted
            "join_gap_p99_ms": float(np.percentile(joined, 99)) * 1000,
            "join_stall_p99_ms": (float(np.percentile(joined, 99)) - base) * 1000,
            "join_stall_max_ms": (max(joined) - base) * 1000,
            "ttft_long_s": f - a, "gaps_during": len(during), "gaps_join": len(joined),
            "chunk_tokens": stats.get("chunk_tokens"), "fused_runs": stats.get("fused_runs"),
            # the scheduler's own step times in the window (this branch's trace)
            "slowest_steps": [{"at_s": round(at, 3), "ms": round(ms, 1), "what": what}
                              for at, ms, what in slowest],
            "step_ms_by_kind": {k: {"n": len(v), "median": round(statistics.median(v), 1),
                                    "max": round(max(v), 1)} for k, v in sorted(kinds.items())}}


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=Path("build/bench-model"))
    parser.add_argument("--streams", default="1,2,4,8,16")
    parser.add_argument("--tokens", type=int, default=40, help="tokens per batched stream")
    parser.add_argument("--base-tokens", type=int, default=12,
                        help="tokens per stream of the one-sequence loop (it is slow)")
    parser.add_argument("--prompt-tokens", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2, help="the loop's limiter (engine.workers)")
    parser.add_argument("--running", type=int, default=4)
    parser.add_argument("--admit-tokens", type=int, default=1024)
    parser.add_argument("--no-baseline-admission", action="store_true")
    parser.add_argument("--no-fused", action="store_true",
                        help="chunks between decode steps, not inside them (engine A/B)")
    parser.add_argument("--label", default="", help="names the run in the output")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    model = load_model(args.model, max_concurrent_runs=args.workers)
    if args.no_fused and hasattr(model.batcher.sched, "use_fused"):
        model.batcher.sched.use_fused = False
    params = sum(int(np.prod(t.shape)) for t in model.manifest.tensors)
    loads = [_load()]
    print(f"model {model.manifest.name}: {params / 1e6:.1f} M parameters, "
          f"{model.num_layers} layers, provider {model.provider}; load average {loads[0]}")
    rows: list[dict[str, Any]] = []
    out: dict[str, Any] = {"model": model.manifest.name, "parameters": params, "rows": rows}

    async def run_all() -> None:
        limiter = trio.CapacityLimiter(args.workers)
        # warm both paths
        await _streams(model, 1, 3, args.prompt_tokens, False, limiter)
        for n in (int(x) for x in args.streams.split(",") if x):
            base = _window(await _streams(model, n, args.base_tokens, args.prompt_tokens,
                                          False, limiter))
            async with trio.open_nursery() as nursery:
                await nursery.start(model.batcher.run)
                batch = _window(await _streams(model, n, args.tokens, args.prompt_tokens,
                                               True, limiter))
                nursery.cancel_scope.cancel()
            rows.append({"streams": n, "batched": batch, "loop": base})
            loads.append(_load())
            print(f"{n:2d} streams: batched {batch['aggregate_tps']:6.2f} tok/s, itl "
                  f"{batch['itl_ms']:7.1f} ms | loop {base['aggregate_tps']:6.2f} tok/s, itl "
                  f"{base['itl_ms']:7.1f} ms | batched/loop {batch['aggregate_tps'] / base['aggregate_tps']:.2f}x"
                  f"  (load {loads[-1]})", flush=True)
        async with trio.open_nursery() as nursery:
            await nursery.start(model.batcher.run)
            out["admission"] = await _admission(model, args.running, args.admit_tokens, True,
                                                limiter)
            nursery.cancel_scope.cancel()
        loads.append(_load())
        if not args.no_baseline_admission:
            out["admission_loop"] = await _admission(model, args.running, args.admit_tokens,
                                                     False, limiter)
            loads.append(_load())

    trio.run(run_all)
    one = rows[0]["batched"] if rows else {}
    if rows:
        print("ratios against one batched stream (aggregate tok/s, per-stream itl):")
    for r in rows:
        b = r["batched"]
        r["agg_vs_1"] = b["aggregate_tps"] / one["aggregate_tps"]
        r["itl_vs_1"] = b["itl_ms"] / one["itl_ms"]
        r["batched_vs_loop"] = b["aggregate_tps"] / r["loop"]["aggregate_tps"]
        print(f"  {r['streams']:2d} streams: {r['agg_vs_1']:.2f}x aggregate, "
              f"{r['itl_vs_1']:.2f}x itl, {r['batched_vs_loop']:.2f}x the loop at the same count")
    for key in ("admission", "admission_loop"):
        if key in out:
            a = out[key]
            print(f"{key}: {a['admit_tokens']}-token prompt with {a['running']} streams running: "
                  f"gaps before {a['gap_before_median_ms']:.0f} ms, during p50 "
                  f"{a['gap_during_p50_ms']:.0f} / p99 {a['gap_during_p99_ms']:.0f} / max "
                  f"{a['gap_during_max_ms']:.0f} ms (stall p99 {a['stall_p99_ms']:.0f} ms, max "
                  f"{a['stall_max_ms']:.0f}); join counted: stall p99 "
                  f"{a['join_stall_p99_ms']:.0f} / max {a['join_stall_max_ms']:.0f} ms; "
                  f"chunk {a['chunk_tokens']}, fused runs {a['fused_runs']}, "
                  f"long prompt's ttft {a['ttft_long_s']:.2f} s")
            if a.get("slowest_steps"):
                print(f"  steps by kind {a['step_ms_by_kind']}\n  slowest {a['slowest_steps']}")
    out["load_average"] = loads
    out["label"] = args.label
    out["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                   text=True, check=False).stdout.strip()
    print(f"load averages: {' | '.join(loads)}")
    if args.out:
        args.out.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
