"""benchmarks/bench_cuda.py, the prepared run for a lent GPU machine, kept working where there is
none: on onnxruntime without the CUDA provider it records that and measures the CPU side of a
small real (random-weight, imported GGUF) model end to end, in child processes as on the GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import onnxruntime as ort
import pytest

from meshd.engine.gguf_import import import_gguf
from tests.engine.gguf_fixtures import write_gguf

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.skipif("CUDAExecutionProvider" in ort.get_available_providers(),
                    reason="this onnxruntime has the CUDA provider: the device run covers it")
def test_bench_cuda_without_cuda_measures_the_cpu_side(tmp_path: Path) -> None:
    model = tmp_path / "model"
    import_gguf(write_gguf(tmp_path / "m.gguf", types={"attn": "Q4_1", "ffn": "Q4_1"}), model)
    out = tmp_path / "cuda.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_cuda.py"), "--model",
                        str(model), "--out", str(out), "--tokens", "16", "--prompt", "64"],
                       capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    rec = json.loads(out.read_text())
    assert rec["sides"]["CUDAExecutionProvider"] == {"error": "not offered by this onnxruntime"}
    cpu = rec["sides"]["CPUExecutionProvider"]
    assert cpu["provider"] == "CPUExecutionProvider"
    assert cpu["one_stream"]["decode_tps_median"] > 0
    assert cpu["one_stream"]["prompt_tokens"] == 64 and cpu["one_stream"]["ttft_ms_median"] > 0
    assert cpu["batch8"]["aggregate_tps"] > 0
    # every kernel of the profiled runs is attributed to the provider that ran it
    kernels = cpu["placement"]["kernels_per_run"]
    assert kernels and all(k.startswith("CPUExecutionProvider:") for k in kernels)
    # the 4-bit products: MatMulNBits, or meshd's own kernel where it is built (q4kernel)
    assert {"CPUExecutionProvider:MatMulNBits", "CPUExecutionProvider:MatMulQ4"} & set(kernels)
    assert len(cpu["chat"]["tokens"]) > 0
    assert "not offered" in r.stdout and f"wrote {out}" in r.stdout
