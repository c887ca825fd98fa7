"""Engine figures: decode tokens/s against a bare onnxruntime loop, decode step time at position
512 vs 16, prefill tokens/s of a 256-token prompt, load time of the shipped model, and peak memory
per stage against the manifest's estimate.

    .venv/bin/python benchmarks/bench_engine.py [--repeats 7] [--threads 1] [--out FILE.json]

The decode, position and prefill figures run on a random-weight model with the shipped model's
architecture but a 1024-token context (the shipped model's context is 256), imported as fp16 into
a temporary directory. Every figure is a median over repeats; engine and bare loop alternate so
that a noisy machine slows both alike.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "engine"))

from hf_fixtures import make_checkpoint  # noqa: E402

from meshd.engine import (  # noqa: E402
    GenerationConfig,
    default_model_path,
    import_hf,
    load_model,
)
from meshd.engine import graph as g  # noqa: E402

SHIPPED_SHAPE = {"layers": 6, "hidden": 192, "intermediate": 512, "heads": 4, "kv_heads": 2,
                 "head_dim": 48, "vocab": 4096, "tie": True}


def make_bench_model(root: Path) -> Path:
    shape: dict[str, Any] = dict(SHIPPED_SHAPE)
    shipped = default_model_path()
    if (shipped / "manifest.json").is_file():
        a = json.loads((shipped / "manifest.json").read_text())["architecture"]
        shape = {"layers": a["num_layers"], "hidden": a["hidden_size"],
                 "intermediate": a["intermediate_size"], "heads": a["num_heads"],
                 "kv_heads": a["num_kv_heads"], "head_dim": a["head_dim"],
                 "vocab": a["vocab_size"], "tie": a["tie_word_embeddings"]}
    hf = make_checkpoint(root / "hf", max_pos=1024, std=0.05, **shape)
    import_hf(hf, root / "model", dtype="fp16")
    return root / "model"


def session_options(threads: int) -> ort.SessionOptions:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = threads
    so.log_severity_level = 3
    return so


class BareLoop:
    """What a user would write with plain onnxruntime over the same stage graph file:
    preallocated numpy caches fed to ``session.run``, new rows written back, argmax."""

    def __init__(self, model_dir: Path, threads: int) -> None:
        manifest = json.loads((model_dir / "manifest.json").read_text())
        a = manifest["architecture"]
        graph_file = manifest["stages"][0]["file"]
        self.sess = ort.InferenceSession(str(model_dir / graph_file), session_options(threads),
                                         providers=["CPUExecutionProvider"])
        self.layers, self.kvh, self.d = a["num_layers"], a["num_kv_heads"], a["head_dim"]

    def generate(self, ids: list[int], n: int) -> list[int]:
        cap = len(ids) + n
        keys = [np.zeros((1, self.kvh, self.d, cap), np.float32) for _ in range(self.layers)]
        values = [np.zeros((1, self.kvh, cap, self.d), np.float32) for _ in range(self.layers)]
        out: list[int] = []
        x, p = np.array(ids, np.int64), 0
        while len(out) < n:
            t = len(x)
            feeds = {g.INPUT_IDS: x[None], g.POSITIONS: np.arange(p, p + t, dtype=np.int64)[None],
                     g.LOGIT_ROWS: np.array([t - 1], np.int64)}
            for i in range(self.layers):
                feeds[g.past_key(i)] = keys[i]
                feeds[g.past_value(i)] = values[i]
            res = self.sess.run(None, feeds)
            for i in range(self.layers):
                keys[i][..., p:p + t] = res[1 + 2 * i]
                values[i][:, :, p:p + t] = res[2 + 2 * i]
            p += t
            out.append(int(np.argmax(res[0][-1])))
            x = np.array(out[-1:], np.int64)
        return out


def _timed(fn: Any) -> tuple[Any, float, float]:
    """Result, wall seconds and CPU seconds of this process (the runs use one thread, so CPU
    time is the figure a noisy shared machine disturbs least)."""
    t0, c0 = time.perf_counter(), time.process_time()
    result = fn()
    return result, time.perf_counter() - t0, time.process_time() - c0


def bench_decode(model_dir: Path, threads: int, repeats: int, n: int) -> dict[str, Any]:
    # Two of each, created engine, bare, bare, engine: where a session sits in memory and in
    # creation order moves its speed by a few percent, so each side gets both places.
    e1 = load_model(model_dir, threads=threads)
    b1, b2 = BareLoop(model_dir, threads), BareLoop(model_dir, threads)
    e2 = load_model(model_dir, threads=threads)
    ids = e1.tokenizer.encode("Once upon a time there was a little mesh")
    cfg = GenerationConfig(max_tokens=n, temperature=0.0, repetition_penalty=1.0)
    rows = []
    for model, bare in ((e1, b1), (e2, b2)) * repeats:
        got, ew, ec = _timed(lambda m=model: [e.token_id for e in m.generate_sync(ids, cfg)])
        ref, bw, bc = _timed(lambda b=bare: b.generate(ids, n))
        assert got == ref[:len(got)], "engine and bare loop disagree"
        rows.append((len(got) / ew, len(ref) / bw, len(got) / ec, len(ref) / bc))
    rows = rows[2:]  # the first pair warms both
    med = [statistics.median(r[k] for r in rows) for k in range(4)]
    return {"tokens": n, "prompt_tokens": len(ids),
            "engine_tokens_per_s": med[0], "bare_tokens_per_s": med[1],
            "ratio_wall": statistics.median(r[0] / r[1] for r in rows),
            "engine_tokens_per_cpu_s": med[2], "bare_tokens_per_cpu_s": med[3],
            "ratio_cpu": statistics.median(r[2] / r[3] for r in rows)}


class _NoRun:
    """Stands in for an onnxruntime session that answers instantly (cached outputs), to time
    the Python work around each step without the machine's noise."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.cache: dict[int, Any] = {}

    def run_with_iobinding(self, binding: Any, *args: Any) -> None:
        return None

    def run(self, names: Any, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        t = feeds[g.POSITIONS].shape[-1]
        if t not in self.cache:
            self.cache[t] = self.real.run(names, feeds)
        return [x.copy() for x in self.cache[t]]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def bench_overhead(model_dir: Path, threads: int, n: int) -> dict[str, Any]:
    """Microseconds per token spent outside onnxruntime: engine (sampling, detokenising, cache
    bookkeeping, IO binding) against the bare loop (feeds, argmax)."""
    model = load_model(model_dir, threads=threads)
    bare = BareLoop(model_dir, threads)
    stage = model.stage(0, model.num_layers)
    ids = model.tokenizer.encode("Once upon a time there was a little mesh")
    cfg = GenerationConfig(max_tokens=n, temperature=0.0, repetition_penalty=1.0)
    stage._session = _NoRun(stage._session)
    bare.sess = _NoRun(bare.sess)

    def engine() -> None:
        for _ in model.generate_sync(ids, cfg):
            pass

    def loop() -> None:
        bare.generate(ids, n)

    per_token = {}
    for name, fn in (("engine", engine), ("bare", loop)):
        fn()
        runs = [_timed(fn)[2] for _ in range(20)]
        per_token[name] = min(runs) / n * 1e6
    return {"engine_us_per_token": per_token["engine"], "bare_us_per_token": per_token["bare"]}


def bench_positions(model_dir: Path, threads: int, repeats: int) -> dict[str, Any]:
    model = load_model(model_dir, threads=threads)
    stage = model.stage(0, model.num_layers)
    rng = np.random.default_rng(0)
    steps = 32

    def step_ms(position: int) -> tuple[float, float]:
        s = stage.open_session()  # capacity grows as in real use
        s.step(rng.integers(2, model.vocab_size, position), np.arange(position), last_only=True)
        wall, cpu = [], []
        for _ in range(steps):
            tok = np.array([rng.integers(2, model.vocab_size)])
            pos = np.array([s.length])
            _, w, c = _timed(functools.partial(s.step, tok, pos, last_only=True))
            wall.append(w)
            cpu.append(c)
        s.free()
        return statistics.median(wall) * 1e3, statistics.median(cpu) * 1e3

    at16, at512 = [], []
    for _ in range(repeats):
        at16.append(step_ms(16))
        at512.append(step_ms(512))
    return {"step_ms_at_16": statistics.median(a[0] for a in at16),
            "step_ms_at_512": statistics.median(a[0] for a in at512),
            "ratio_wall": statistics.median(b[0] / a[0] for a, b in zip(at16, at512, strict=True)),
            "step_cpu_ms_at_16": statistics.median(a[1] for a in at16),
            "step_cpu_ms_at_512": statistics.median(a[1] for a in at512),
            "ratio_cpu": statistics.median(b[1] / a[1] for a, b in zip(at16, at512, strict=True))}


def bench_prefill(model_dir: Path, threads: int, repeats: int, tokens: int = 256
                  ) -> dict[str, Any]:
    model = load_model(model_dir, threads=threads)
    stage = model.stage(0, model.num_layers)
    ids = np.random.default_rng(1).integers(2, model.vocab_size, tokens)
    wall, cpu = [], []
    for _ in range(repeats + 1):
        s = stage.open_session(tokens)
        _, w, c = _timed(functools.partial(s.step, ids, np.arange(tokens), last_only=True))
        wall.append(w)
        cpu.append(c)
        s.free()
    med, med_cpu = statistics.median(wall[1:]), statistics.median(cpu[1:])
    return {"tokens": tokens, "ms": med * 1e3, "tokens_per_s": tokens / med,
            "cpu_ms": med_cpu * 1e3, "tokens_per_cpu_s": tokens / med_cpu}


def bench_load(repeats: int) -> dict[str, Any]:
    shipped = default_model_path()
    if not (shipped / "manifest.json").is_file():
        return {"skipped": f"no shipped model at {shipped}"}
    code = ("import time; t0 = time.perf_counter(); from meshd.engine import load_model, "
            "default_model_path; t1 = time.perf_counter(); load_model(default_model_path()); "
            "t2 = time.perf_counter(); print(t1 - t0, t2 - t1)")
    cold = []
    for _ in range(3):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             check=True, cwd=ROOT).stdout.split()
        cold.append((float(out[0]), float(out[1])))
    warm = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        load_model(shipped)
        warm.append(time.perf_counter() - t0)
    return {"load_ms": statistics.median(warm) * 1e3,
            "first_load_in_process_ms": statistics.median(c[1] for c in cold) * 1e3,
            "import_ms": statistics.median(c[0] for c in cold) * 1e3}


def _rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(field)


def memory_child(model_dir: str, start: int, end: int, tokens: int, threads: int) -> None:
    """Run in a fresh process: peak RSS growth from building a stage and running ``tokens``."""
    from meshd.engine.manifest import read_manifest
    from meshd.engine.planning import stage_memory
    from meshd.engine.runtime import Model
    from meshd.engine.tokenizer import Tokenizer

    path = Path(model_dir)
    manifest = read_manifest(path)
    tok = Tokenizer(path / manifest.tokenizer.file, manifest.tokenizer)
    model = Model(path, manifest, tok, ["CPUExecutionProvider"], (start, end), threads, 1)
    ids = np.random.default_rng(2).integers(2, manifest.arch.vocab_size, tokens)
    hidden = np.random.default_rng(3).standard_normal((tokens, manifest.arch.hidden_size))
    base = _rss_kib("VmRSS")
    stage = model.stage(start, end)
    s = stage.open_session(tokens)
    x = ids if stage.is_first else hidden.astype(np.float32)
    s.step(x, np.arange(tokens), last_only=True)
    peak = _rss_kib("VmHWM")
    est = stage_memory(manifest.arch, start, end, manifest.dtype)
    print(json.dumps({"layers": [start, end], "tokens": tokens,
                      "peak_bytes": (peak - base) * 1024, "estimate_bytes": est.total(tokens),
                      "kv_bytes": s.memory_bytes()}))


def bench_memory(model_dir: Path, threads: int, tokens: int = 512) -> list[dict[str, Any]]:
    layers = json.loads((model_dir / "manifest.json").read_text())["architecture"]["num_layers"]
    half = layers // 2
    out = []
    for start, end in ((0, layers), (0, half), (half, layers)):
        res = subprocess.run(
            [sys.executable, __file__, "--memory-child", str(model_dir), str(start), str(end),
             str(tokens), str(threads)], capture_output=True, text=True, check=True)
        row = json.loads(res.stdout)
        row["peak_over_estimate"] = row["peak_bytes"] / row["estimate_bytes"]
        out.append(row)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--decode-tokens", type=int, default=64)
    parser.add_argument("--out", type=Path, help="also write the figures to this JSON file")
    parser.add_argument("--memory-child", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_child:
        d, s, e, t, th = args.memory_child
        memory_child(d, int(s), int(e), int(t), int(th))
        return
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = make_bench_model(Path(tmp))
        results: dict[str, Any] = {
            "machine": {"cpus": os.cpu_count(), "onnxruntime": ort.__version__,
                        "threads": args.threads, "load_avg": os.getloadavg()[0]},
            "decode": bench_decode(model_dir, args.threads, args.repeats, args.decode_tokens),
            "overhead": bench_overhead(model_dir, args.threads, args.decode_tokens),
            "positions": bench_positions(model_dir, args.threads, args.repeats),
            "prefill": bench_prefill(model_dir, args.threads, args.repeats),
            "load": bench_load(args.repeats),
            "memory": bench_memory(model_dir, args.threads),
        }
    d, p, f, ld = results["decode"], results["positions"], results["prefill"], results["load"]
    o = results["overhead"]
    step_us = 1e6 / d["bare_tokens_per_cpu_s"]
    o["implied_ratio"] = step_us / (step_us + o["engine_us_per_token"] - o["bare_us_per_token"])
    print(f"decode   engine {d['engine_tokens_per_s']:.0f} tok/s, bare onnxruntime "
          f"{d['bare_tokens_per_s']:.0f} tok/s, ratio {d['ratio_wall']:.3f}; per CPU second "
          f"{d['engine_tokens_per_cpu_s']:.0f} vs {d['bare_tokens_per_cpu_s']:.0f}, ratio "
          f"{d['ratio_cpu']:.3f} (goal >= 0.95)")
    print(f"overhead outside onnxruntime: engine {o['engine_us_per_token']:.1f} us/token, bare "
          f"loop {o['bare_us_per_token']:.1f} us/token; with a {step_us:.0f} us step the ratio "
          f"is {o['implied_ratio']:.3f} on a quiet machine")
    print(f"position step at 16 {p['step_ms_at_16']:.3f} ms, at 512 {p['step_ms_at_512']:.3f} ms,"
          f" ratio {p['ratio_wall']:.2f}; CPU {p['step_cpu_ms_at_16']:.3f} vs "
          f"{p['step_cpu_ms_at_512']:.3f} ms, ratio {p['ratio_cpu']:.2f} (goal <= 1.5)")
    print(f"prefill  {f['tokens']} tokens in {f['ms']:.1f} ms = {f['tokens_per_s']:.0f} tok/s "
          f"(CPU {f['cpu_ms']:.1f} ms = {f['tokens_per_cpu_s']:.0f} tok/s)")
    if "load_ms" in ld:
        print(f"load     shipped model {ld['load_ms']:.0f} ms (first in a process "
              f"{ld['first_load_in_process_ms']:.0f} ms, after {ld['import_ms']:.0f} ms of "
              "imports; goal < 1000 ms)")
    else:
        print(f"load     {ld['skipped']}")
    for m in results["memory"]:
        s, e = m["layers"]
        print(f"memory   layers [{s}, {e}) at {m['tokens']} tokens: peak "
              f"{m['peak_bytes'] / 2**20:.1f} MiB, estimate {m['estimate_bytes'] / 2**20:.1f} MiB"
              f" ({m['peak_over_estimate']:.2f}x)")
    if args.out:
        args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
