"""An emulated-device model for testnets of many daemons on few cores: random weights, one tiny
layer, and a real model's tokenizer, so that its compute is negligible while text, token ids,
prefix blocks and the chat template are exactly the real model's.

    .venv/bin/python benchmarks/emulated_model.py --model /work/models/smol-q41-l4 [--measure]

prints the folder it built (or found) under ``build/emulated-model/``; nothing is downloaded.
``bench_testnet_chat.py --emulated-model`` calls ``build`` the same way and serves the result.

The checkpoint (``tests/engine/hf_fixtures.make_checkpoint``, Hugging Face layout) is a Llama of
1 layer, hidden 64, 7 query and 7 KV heads of 16 dimensions, MLP 128, with ``--model``'s
vocabulary size, context (``max_position_embeddings``), BOS/EOS ids, ``tokenizer.json`` and chat
template, imported with meshd's own importer (fp32). The output rows of the end tokens are zero,
so a greedy answer never ends early: it runs to its ``max_tokens`` (random weights otherwise end
at an arbitrary token). Its KV costs 2 x 1 x 7 x 16 x 4 = 896 bytes a token, 1/51.4 of
SmolLM2-135M's 46,080: ``prefix_cache_mb_for`` scales a node's prefix-cache budget by that ratio
so that each node holds as many prompt tokens as it would with the real model (the budget is
what makes a node evict, and eviction is part of the prefix-reuse figure). The shape is chosen
for that: the budget is whole MiB and head_dim a multiple of 16 (onnxruntime's attention), and
256 MiB of SmolLM2's KV (5,825 tokens) becomes 5 MiB of this one's (5,851 tokens, +0.4%).

``--measure`` times a prefill of 2,000 tokens in one step and in the daemon's 16-token chunks,
wall and CPU time of this process, one onnxruntime thread.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "engine"))

SHAPE: dict[str, Any] = {"arch": "llama", "layers": 1, "hidden": 64, "intermediate": 128,
                         "heads": 7, "kv_heads": 7, "head_dim": 16, "tie": False, "std": 0.2,
                         "seed": 32}
VERSION = 1  # bump when the recipe changes: the cache key includes it
CACHE = ROOT / "build" / "emulated-model"


def _source(model: Path) -> tuple[dict[str, Any], bytes]:
    manifest_path, tok_path = model / "manifest.json", model / "tokenizer.json"
    if not manifest_path.is_file() or not tok_path.is_file():
        raise SystemExit(f"error: {model}: not a meshd model directory (manifest.json and "
                         f"tokenizer.json)")
    return json.loads(manifest_path.read_text()), tok_path.read_bytes()


def build(model: Path, cache: Path = CACHE) -> Path:
    """The emulated model for the real meshd model directory ``model``: built once into
    ``cache/<key>`` (the key hashes the tokenizer, its settings and this recipe), then reused."""
    from meshd.engine import import_hf

    manifest, tok_bytes = _source(model)
    arch, tok = manifest["architecture"], manifest["tokenizer"]
    key = hashlib.sha256(json.dumps([VERSION, SHAPE, arch["vocab_size"],
                                     arch["max_position_embeddings"], tok.get("bos_token_id"),
                                     tok.get("eos_token_ids"), tok.get("bos_token"),
                                     tok.get("eos_token"), tok.get("chat_template")]).encode()
                         + tok_bytes).hexdigest()[:16]
    out = cache / f"{manifest.get('name', 'model')}-{key}"
    if (out / "manifest.json").is_file():
        return out
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="hf-", dir=cache) as tmp:
        hf = _checkpoint(Path(tmp) / "hf", arch, tok, tok_bytes)
        import_hf(hf, out, name=f"{manifest.get('name', 'model')}-emulated", force=True)
    return out


def _checkpoint(hf: Path, arch: dict[str, Any], tok: dict[str, Any], tok_bytes: bytes) -> Path:
    import numpy as np
    from hf_fixtures import make_checkpoint
    from safetensors.numpy import load_file, save_file

    make_checkpoint(hf, vocab=int(arch["vocab_size"]), max_pos=int(arch["max_position_embeddings"]),
                    **SHAPE)
    (hf / "tokenizer.json").write_bytes(tok_bytes)
    eos = [int(i) for i in tok.get("eos_token_ids") or []]
    cfg = json.loads((hf / "config.json").read_text())
    cfg.update(bos_token_id=tok.get("bos_token_id"), eos_token_id=eos)
    (hf / "config.json").write_text(json.dumps(cfg, indent=1))
    tcfg = {"bos_token": tok.get("bos_token"), "eos_token": tok.get("eos_token"),
            "tokenizer_class": "PreTrainedTokenizerFast"}
    if tok.get("chat_template"):
        tcfg["chat_template"] = tok["chat_template"]
    (hf / "tokenizer_config.json").write_text(json.dumps(tcfg, indent=1))
    weights = load_file(str(hf / "model.safetensors"))
    head = weights["lm_head.weight"].copy()
    head[eos] = np.float32(0.0)  # a zero logit never wins against ~49k random ones
    weights["lm_head.weight"] = head
    save_file(weights, str(hf / "model.safetensors"), metadata={"format": "pt"})
    return hf


def kv_bytes_per_token(model: Path) -> int:
    stages = json.loads((model / "manifest.json").read_text())["stages"]
    return int(sum(s["memory"]["kv_bytes_per_token"] for s in stages))


def prefix_cache_mb_for(real_mb: int, real: Path, emulated: Path) -> int:
    """The emulated model's prefix-cache budget that holds as many tokens as ``real_mb`` holds
    for the real model (at least 1 MiB where ``real_mb`` keeps any; 0 stays 0)."""
    if real_mb <= 0:
        return 0
    return max(1, round(real_mb * kv_bytes_per_token(emulated) / kv_bytes_per_token(real)))


def measure(model: Path, tokens: int = 2000, chunk: int = 16, repeats: int = 3) -> dict[str, Any]:
    """Wall and CPU ms of a ``tokens``-token prefill, in one step and in ``chunk``-token steps."""
    import numpy as np

    from meshd.engine import load_model

    m = load_model(model, threads=1)
    stage = m.stage(0, m.num_layers)
    ids = np.random.default_rng(1).integers(3, m.vocab_size, tokens)
    out: dict[str, Any] = {"tokens": tokens, "chunk": chunk}
    for label, step in (("one_step", tokens), ("chunked", chunk)):
        walls, cpus = [], []
        for _ in range(repeats):
            s = stage.open_session(tokens)
            t0, c0 = time.perf_counter(), time.process_time()
            for a in range(0, tokens, step):
                s.step(ids[a:a + step], np.arange(a, min(a + step, tokens)), last_only=True)
            walls.append(time.perf_counter() - t0)
            cpus.append(time.process_time() - c0)
            s.free()
        out[label] = {"wall_ms": round(min(walls) * 1e3, 1), "cpu_ms": round(min(cpus) * 1e3, 1)}
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="the real meshd model directory to emulate")
    p.add_argument("--cache", default=str(CACHE), help="where built models are kept")
    p.add_argument("--measure", action="store_true",
                   help="also time a 2,000-token prefill of the emulated model (and of --model "
                        "with --measure-real)")
    p.add_argument("--measure-real", action="store_true")
    args = p.parse_args()
    out = build(Path(args.model), Path(args.cache))
    print(out)
    if args.measure:
        print("emulated", json.dumps(measure(out)))
    if args.measure_real:
        print("real", json.dumps(measure(Path(args.model), repeats=1)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
