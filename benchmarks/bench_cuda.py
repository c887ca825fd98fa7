"""The real model on onnxruntime's CUDA execution provider, beside the CPU one on the same machine.

    PYTHONPATH=. python3 benchmarks/bench_cuda.py --model DIR --out FILE.json [--tokens 128]

For a lent machine with an NVIDIA GPU (``scripts/device_cuda.sh`` stages onnxruntime-gpu and
the model there and runs this). For each provider the machine offers (CUDA first, then the
CPU, with onnxruntime's default threads), in a process of its own so that neither warms the
other:

- the load: seconds, the provider the engine chose (``Model.provider``);
- a greedy chat answer ("Name three primary colors.", 40 tokens): the real model must say it
  on the GPU as on the CPU (tests/models/test_pull_live.py holds the CPU to its prefix);
- one greedy stream's decode tokens/s (``--tokens`` tokens, end of sequence ignored; medians of
  3), and the time to first token of a ``--prompt``-token prompt (512; from
  ``benchmarks/data/kjv_heldout.txt``);
- 8 concurrent streams through the batch scheduler (the fused graph, as a daemon loads it):
  aggregate tokens/s once all 8 decode;
- where each operator ran: a profiled short generation's kernels (a 32-token prompt, 4 steps),
  counted and timed by provider, per run (a node onnxruntime cannot place on CUDA runs on the
  CPU, with copies around it);
- NVML, read through meshd's own telemetry (``meshd.telemetry.HostTelemetry``) every 0.2 s
  while each figure is taken: utilisation, memory used, power.

Each part is recorded on its own: one that fails writes its error and the next runs. Prints a
table and writes everything to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TEXT = ROOT / "benchmarks" / "data" / "kjv_heldout.txt"
CHAT = "Name three primary colors."


class Nvml:
    """meshd's GPU readings every ``every_s`` seconds in a thread, kept per phase."""

    def __init__(self, every_s: float = 0.2) -> None:
        from meshd.telemetry import HostTelemetry

        self.src = HostTelemetry()
        self.every_s = every_s
        self.rows: list[dict[str, Any]] = []
        self.phase = "idle"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                hw = self.src.read()
            except Exception as err:  # a reading that fails is recorded, not fatal
                self.rows.append({"phase": self.phase, "error": repr(err)})
                continue
            for g in hw.gpus:
                self.rows.append({"phase": self.phase, "t": round(time.monotonic(), 2),
                                  "gpu": g.index, "util_pct": g.utilisation_pct,
                                  "mem_used_mib": (g.memory_used_bytes or 0) / 2**20,
                                  "power_w": g.power_draw_w})

    def __enter__(self) -> Nvml:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict[str, dict[str, float | None]]:
        out: dict[str, dict[str, float | None]] = {}
        for phase in dict.fromkeys(r["phase"] for r in self.rows):
            rs = [r for r in self.rows if r["phase"] == phase and "error" not in r]

            def peak(key: str, rs: list[dict[str, Any]] = rs) -> float | None:
                vals = [r[key] for r in rs if r.get(key) is not None]
                return round(max(vals), 1) if vals else None

            out[phase] = {"readings": len(rs), "util_pct_max": peak("util_pct"),
                          "mem_used_mib_max": peak("mem_used_mib"), "power_w_max": peak("power_w")}
        return out


def _part(rec: dict[str, Any], name: str, fn: Any) -> None:
    t0 = time.monotonic()
    try:
        rec[name] = fn()
    except Exception as err:  # each part stands alone
        rec[name] = {"error": f"{type(err).__name__}: {err}"}
    rec.setdefault("seconds", {})[name] = round(time.monotonic() - t0, 2)


def one_provider(model_dir: str, provider: str, tokens: int, prompt: int) -> dict[str, Any]:
    """Every figure for one provider (run in a child process: ``--child``)."""
    from meshd.engine import GenerationConfig, load_model
    from meshd.engine import runtime as rt
    from meshd.engine.scheduler import BatchScheduler, prepare
    from meshd.testing.decoding import IgnoreEos, decode_tps

    rec: dict[str, Any] = {"provider_asked": provider}
    providers = [provider]
    nv = Nvml() if provider == "CUDAExecutionProvider" else None
    if nv is not None:
        nv.__enter__()

    def phase(name: str) -> None:
        if nv is not None:
            nv.phase = name

    phase("load")
    t0 = time.perf_counter()
    model = load_model(model_dir, providers=providers)
    rec["load_s"] = round(time.perf_counter() - t0, 2)
    rec["provider"] = model.provider
    tok = model.tokenizer
    ids = tok.encode(TEXT.read_text(encoding="utf-8"), add_special_tokens=False)

    def chat() -> dict[str, Any]:
        phase("chat")
        cfg = GenerationConfig(max_tokens=40, temperature=0.0, repetition_penalty=1.0)
        out = [ev.token_id for ev in model.generate_sync(model.encode_prompt(CHAT, chat=True), cfg)]
        return {"tokens": out, "text": tok.decode(out)}

    def decode() -> dict[str, Any]:
        phase("decode")
        model.tokenizer = IgnoreEos(tok)  # type: ignore[assignment]
        try:
            cfg = GenerationConfig(max_tokens=tokens, temperature=0.0, repetition_penalty=1.0)
            stream = ids[:32]
            for _ in model.generate_sync(stream, GenerationConfig(max_tokens=8, temperature=0.0)):
                pass
            tps = []
            for _ in range(3):
                tps.append(decode_tps([time.perf_counter()
                                       for _ in model.generate_sync(stream, cfg)]))
            phase("prefill")
            one = GenerationConfig(max_tokens=1, temperature=0.0)
            ttft = []
            for _ in range(3):
                t = time.perf_counter()
                for _ in model.generate_sync(ids[100:100 + prompt], one):
                    pass
                ttft.append((time.perf_counter() - t) * 1000)
        finally:
            model.tokenizer = tok
        return {"decode_tps": [round(x, 1) for x in tps], "decode_tps_median": round(
            statistics.median(tps), 1), "ttft_ms": [round(x, 1) for x in ttft],
            "ttft_ms_median": round(statistics.median(ttft), 1), "prompt_tokens": prompt}

    def placement() -> dict[str, Any]:
        phase("placement")
        orig = rt.Model._session_options

        def profiled(self: Any, start: int, end: int) -> Any:
            so = orig(self, start, end)
            so.enable_profiling = True
            so.profile_file_prefix = f"/tmp/meshd-cuda-profile-{provider}"
            return so

        rt.Model._session_options = profiled  # type: ignore[method-assign]
        try:
            m = load_model(model_dir, providers=providers)
        finally:
            rt.Model._session_options = orig  # type: ignore[method-assign]
        for _ in m.generate_sync(ids[:32], GenerationConfig(max_tokens=4, temperature=0.0)):
            pass
        st = m.stage(0, m.num_layers)
        events = json.loads(Path(st._session.end_profiling()).read_text())
        runs = sum(1 for e in events if e.get("name") == "model_run")
        nodes: Counter[str] = Counter()
        us: Counter[str] = Counter()
        for e in events:
            if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
                key = f"{e['args'].get('provider', '?')}:{e['args'].get('op_name', '?')}"
                nodes[key] += 1
                us[key] += e["dur"]
        return {"runs": runs, "kernels_per_run": {k: round(v / runs, 1) for k, v in nodes.items()},
                "kernel_us_per_run": {k: round(v / runs, 1) for k, v in us.most_common()}}

    def batched() -> dict[str, Any]:
        phase("batch8")
        fused = load_model(model_dir, providers=providers, fused=True)
        fused.tokenizer = IgnoreEos(fused.tokenizer)  # type: ignore[assignment]
        sched = BatchScheduler(fused)
        sched.calibrate(max_batch=8)
        cfg = GenerationConfig(max_tokens=10_000, temperature=0.0, repetition_penalty=1.0)
        for i in range(8):
            sched.add(prepare(fused, ids[i * 32:(i + 1) * 32], cfg, False))
        while len(sched.running) < 8:
            sched.step()
        steps = []
        for _ in range(64):
            t = time.perf_counter()
            sched.step()
            steps.append(time.perf_counter() - t)
        med = statistics.median(steps)
        return {"step_ms_median": round(med * 1000, 2), "aggregate_tps": round(8 / med, 1),
                "provider": fused.provider}

    _part(rec, "chat", chat)
    _part(rec, "one_stream", decode)
    _part(rec, "batch8", batched)
    _part(rec, "placement", placement)
    if nv is not None:
        nv.__exit__()
        rec["nvml"] = nv.summary()
        rec["nvml_readings"] = nv.rows
    return rec


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="a meshd model directory (an imported GGUF)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--prompt", type=int, default=512, help="the prefill prompt's tokens")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print("RESULT " + json.dumps(one_provider(args.model, args.child, args.tokens, args.prompt)))
        return 0

    import onnxruntime as ort

    from meshd.engine import choose_providers

    rec: dict[str, Any] = {"onnxruntime": ort.__version__,
                           "available": ort.get_available_providers(),
                           "meshd_auto_choice": choose_providers(None), "model": args.model}
    try:
        rec["nvidia_smi"] = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True,
                                           timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError) as err:
        rec["nvidia_smi"] = f"not run: {err}"
    rec["sides"] = {}
    for p in ("CUDAExecutionProvider", "CPUExecutionProvider"):
        if p not in rec["available"]:
            rec["sides"][p] = {"error": "not offered by this onnxruntime"}
            continue
        r = subprocess.run([sys.executable, __file__, "--model", args.model, "--out", "-",
                            "--tokens", str(args.tokens), "--prompt", str(args.prompt),
                            "--child", p],
                           capture_output=True, text=True, timeout=1800)
        lines = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
        rec["sides"][p] = (json.loads(lines[-1][7:]) if lines else
                           {"error": f"exit {r.returncode}", "stderr": r.stderr[-3000:]})
    answers = [s.get("chat", {}).get("tokens") for s in rec["sides"].values() if "error" not in s]
    rec["same_answer"] = len(answers) == 2 and answers[0] == answers[1]
    args.out.write_text(json.dumps(rec, indent=1) + "\n")
    print(f"onnxruntime {rec['onnxruntime']}; offered: {', '.join(rec['available'])}")
    print(f"| provider | ran on | load s | decode tok/s | TTFT {args.prompt} ms | 8 streams tok/s "
          "| answer |")
    print("|---|---|---|---|---|---|---|")
    for p, s in rec["sides"].items():
        if "error" in s:
            print(f"| {p} | - | - | - | - | - | {s['error']} |")
            continue
        one, b8, chat = s.get("one_stream", {}), s.get("batch8", {}), s.get("chat", {})
        print(f"| {p} | {s.get('provider')} | {s.get('load_s')} | "
              f"{one.get('decode_tps_median', one.get('error'))} | "
              f"{one.get('ttft_ms_median', '-')} | "
              f"{b8.get('aggregate_tps', b8.get('error'))} | "
              f"{json.dumps(chat.get('text', chat.get('error')))[:80]} |")
    print(f"the same greedy answer on both: {rec['same_answer']}")
    cuda = rec["sides"].get("CUDAExecutionProvider", {})
    if "nvml" in cuda:
        print("NVML peaks by phase:", json.dumps(cuda["nvml"]))
    if isinstance(cuda.get("placement"), dict) and "kernel_us_per_run" in cuda["placement"]:
        top = list(cuda["placement"]["kernel_us_per_run"].items())[:12]
        print("CUDA side, a decode step's kernels (provider:op us):", top)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
