"""The arithmetic of benchmarks/perplexity.py (llama-perplexity's method) and the prompt recipe
of benchmarks/bench_llamacpp.py, on small tables (no model, no llama.cpp)."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", ROOT / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


ppl = _load("perplexity")
bench = _load("bench_llamacpp")


@pytest.mark.parametrize(("n_ctx", "bos", "limit", "want"), [
    (4, None, -1, [[0, 1, 2, 3], [4, 5, 6, 7]]),  # the 2 tokens left over are dropped
    (4, 99, -1, [[99, 1, 2, 3], [99, 5, 6, 7]]),  # BOS replaces each chunk's first token
    (4, 99, 1, [[99, 1, 2, 3]]),
    (6, None, -1, [[0, 1, 2, 3, 4, 5]]),
    (12, None, -1, []),
])
def test_chunks_are_cut_as_llama_perplexity_cuts_them(n_ctx: int, bos: int | None, limit: int,
                                                      want: list[list[int]]) -> None:
    assert ppl.make_chunks(list(range(10)), n_ctx, bos, limit) == want


def test_the_second_half_less_the_last_position_is_scored() -> None:
    # n_ctx 6, first 3: positions 3 and 4 predict tokens 4 and 5; position 5 is not scored
    chunk = [9, 9, 9, 9, 1, 2]
    logits = np.zeros((3, 4), np.float32)
    logits[0, 1] = math.log(3.0)  # p(1) = 3/6 at position 3
    logits[2, :] = 50.0  # position 5: must not count
    nll, nll2, count = ppl.chunk_nll(logits, chunk, 3)
    assert count == 2
    want = [-math.log(0.5), -math.log(0.25)]  # position 4: uniform over 4 tokens
    assert nll == pytest.approx(sum(want))
    assert nll2 == pytest.approx(sum(v * v for v in want))


@pytest.mark.parametrize(("nlls", "ppl_want"), [
    ([math.log(4.0)] * 5, 4.0),
    ([0.0, 2.0], math.e),
])
def test_estimate_is_exp_of_the_mean_with_llamas_error(nlls: list[float], ppl_want: float) -> None:
    n = len(nlls)
    value, err = ppl.estimate(sum(nlls), sum(v * v for v in nlls), n)
    assert value == pytest.approx(ppl_want)
    mean = sum(nlls) / n
    var = sum(v * v for v in nlls) / n - mean * mean
    if var > 1e-12:
        assert err == pytest.approx(math.sqrt(var / (n - 1)) * value)
    else:
        assert math.isnan(err)


def test_one_trailing_newline_is_dropped_as_llamas_f_does(tmp_path: Path) -> None:
    f = tmp_path / "t.txt"
    f.write_text("a\n\n", encoding="utf-8")
    assert ppl.read_text(f) == "a\n"


def test_prompts_are_disjoint_runs_of_the_text_with_bos_first() -> None:
    got = bench.make_prompts(list(range(100, 120)), 1, stream_prompt=3, streams=2, prompt=4)
    assert got == {"streams": [[1, 101, 102], [1, 104, 105]], "prefill": [1, 107, 108, 109]}
    got = bench.make_prompts(list(range(10)), None, stream_prompt=2, streams=2, prompt=2)
    assert got == {"streams": [[0, 1], [2, 3]], "prefill": [4, 5]}
    with pytest.raises(SystemExit, match="fewer than"):
        bench.make_prompts(list(range(5)), None, stream_prompt=2, streams=2, prompt=2)


def test_decode_rate_counts_the_gaps_between_tokens() -> None:
    assert bench.decode_tps([0.0, 0.5, 1.0]) == pytest.approx(2.0)
    assert bench.decode_tps([1.0]) == 0.0


def test_weight_bytes_count_each_sides_blocks(tmp_path: Path) -> None:
    """Q4_1 layers and a tied Q8_0 embedding: llama.cpp reads 20 and 34 bytes a 32-weight block,
    meshd 16 + 8 (+4 for a Q4_1 block's minimum) and 32 + 8; fp32 norms alike on both sides.
    Imported through meshd's real GGUF import, so a change to what it stores shows here."""
    from meshd.engine.gguf_import import import_gguf
    from tests.engine.gguf_fixtures import write_gguf

    gguf_path = write_gguf(tmp_path / "m.gguf", types={"attn": "Q4_1", "ffn": "Q4_1",
                                                       "embed": "Q8_0"},
                           layers=2, hidden=256, intermediate=512, heads=4, kv_heads=2, vocab=300)
    import_gguf(gguf_path, tmp_path / "out")
    got = bench.weight_bytes_per_step(tmp_path / "out", gguf_path)
    # per layer q 256x256, k and v 128x256, o 256x256, gate and up 512x256, down 256x512
    q41_blocks = 2 * (256 * 256 * 2 + 128 * 256 * 2 + 512 * 256 * 3) // 32
    q80_blocks = 300 * 256 // 32  # the tied embedding, read whole as the output head
    norms = (2 * 2 + 1) * 256 * 4
    assert got["llama_weight_mib"] * 2**20 == q41_blocks * 20 + q80_blocks * 34 + norms
    assert got["meshd_weight_mib"] * 2**20 == q41_blocks * 28 + q80_blocks * 40 + norms


def test_merge_pools_the_repeats_and_refuses_other_runs(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    import json

    def run(name: str, llama: list[float], meshd: list[float], **over: object) -> Path:
        d = {"gguf": "m.gguf", "meshd_model": "/m", "params": {"threads": 2, "streams": 8,
                                                            "tokens": 128, "prompt": 512},
             "repeats": len(llama), "commit": name,
             "runs": {"llama": [{"a_decode_tps": x} for x in llama],
                      "meshd": [{"a_decode_tps": x} for x in meshd]}, **over}
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(d))
        return path

    a = run("a", [100.0, 110.0, 120.0], [90.0, 91.0, 92.0])
    b = run("b", [130.0, 140.0], [50.0, 60.0])
    out = tmp_path / "merged.json"
    assert bench.merge([a, b], out) == 0
    got = json.loads(out.read_text())
    assert got["repeats"] == 5
    # medians over all five repeats, not a median of the runs' medians
    assert got["medians"]["llama"]["a_decode_tps"] == 120.0
    assert got["medians"]["meshd"]["a_decode_tps"] == 90.0
    assert got["ratios_meshd_over_llama"]["a_decode_tps"] == pytest.approx(0.75)
    assert [m["commit"] for m in got["merged_from"]] == ["a", "b"]
    other = run("c", [1.0], [1.0], params={"threads": 4})
    with pytest.raises(SystemExit, match="differs .* in params"):
        bench.merge([a, other], tmp_path / "no.json")
    assert not (tmp_path / "no.json").exists()
    # a run still being written (or a wrong path) is one line, not a traceback
    half = tmp_path / "half.json"
    half.write_text('{"gguf": ')
    for bad in (half, tmp_path / "missing.json"):
        with pytest.raises(SystemExit, match=f"{bad.name}: cannot read a run"):
            bench.merge([a, bad], tmp_path / "no.json")
    assert not (tmp_path / "no.json").exists()
