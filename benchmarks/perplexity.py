"""Perplexity of a meshd model directory and of llama-perplexity on a GGUF, side by side, on the
same fixed text, computed the way llama-perplexity computes it.

The method (llama.cpp's tools/perplexity/perplexity.cpp, ``perplexity()``, with no
``--ppl-stride``), followed here step for step:

* the whole text is tokenized at once, with the model's special tokens (a BOS in front when the
  tokenizer adds one); llama-perplexity's ``-f`` drops one trailing newline of the file first;
* it is cut into ``n_chunk = len(tokens) // n_ctx`` chunks of ``n_ctx`` tokens (the rest is
  dropped; ``--chunks`` caps the count), each run from an empty KV cache at positions
  0..n_ctx-1; when the tokenizer adds a BOS, each chunk's first token is *replaced* by BOS
  (not shifted);
* with ``first = n_ctx // 2``, the logits of positions ``first .. n_ctx-2`` are scored against
  the next token: ``n_ctx - first - 1`` tokens per chunk;
* PPL = exp(mean NLL), and its error ``sqrt((mean(NLL^2) - mean(NLL)^2) / (count - 1)) * PPL``.

On the meshd side a whole-model stage session runs the first half of a chunk with only its last
row of logits, then the second half with every row (the stage graph's ``logit_rows``), so only
the scored rows reach numpy. Both sides use ``--threads`` threads.

    .venv/bin/python benchmarks/perplexity.py --meshd-model DIR --gguf FILE.gguf \\
        [--ctx 512] [--chunks N] [--threads 2] [--out benchmarks/results-perplexity-X.json]

The text defaults to benchmarks/data/kjv_heldout.txt (see benchmarks/data/README.md). Either
side may be left out; ``--llama-json FILE`` reuses the llama.cpp figures of an earlier run's
``--out`` (llama-perplexity takes about 20 minutes over this text on a busy 2-core box).
``--tokens-from llama`` scores the meshd model on llama-tokenize's ids (to tell a tokenizer
difference from a model difference); with ``--gguf`` the two tokenizations are compared.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from meshd.testing.llamacpp import cpu_features, llama_bin, missing_reason, run_tool  # noqa: E402

DEFAULT_TEXT = ROOT / "benchmarks" / "data" / "kjv_heldout.txt"


# ----------------------------------------------------------------------------- the method


def read_text(path: Path) -> str:
    """The text as llama-perplexity's ``-f`` reads it: one trailing newline dropped."""
    text = path.read_text(encoding="utf-8")
    return text[:-1] if text.endswith("\n") else text


def make_chunks(tokens: list[int], n_ctx: int, bos: int | None, limit: int = -1) -> list[list[int]]:
    """The chunks llama-perplexity evaluates: ``len(tokens) // n_ctx`` (at most ``limit`` when
    >= 0) runs of ``n_ctx`` tokens, each one's first token replaced by ``bos`` (None: kept)."""
    n = len(tokens) // n_ctx
    if limit >= 0:
        n = min(n, limit)
    out = []
    for i in range(n):
        chunk = list(tokens[i * n_ctx:(i + 1) * n_ctx])
        if bos is not None:
            chunk[0] = bos
        out.append(chunk)
    return out


def chunk_nll(logits: np.ndarray, chunk: list[int], first: int) -> tuple[float, float, int]:
    """(sum of NLL, sum of NLL^2, count) of one chunk. ``logits`` holds the rows of positions
    ``first .. first + len(logits) - 1``; positions ``first .. n_ctx - 2`` are scored against
    the token after them."""
    n = len(chunk) - 1 - first
    x = logits[:n].astype(np.float64)
    m = x.max(axis=1, keepdims=True)
    lse = m[:, 0] + np.log(np.exp(x - m).sum(axis=1))
    target = np.asarray(chunk[first + 1:first + 1 + n], np.int64)
    nll = lse - x[np.arange(n), target]
    return float(nll.sum()), float((nll * nll).sum()), n


def estimate(nll: float, nll2: float, count: int) -> tuple[float, float]:
    """(PPL, its +/- error) from the sums, as llama-perplexity prints them."""
    mean = nll / count
    ppl = math.exp(mean)
    var = nll2 / count - mean * mean
    err = math.sqrt(var / (count - 1)) * ppl if var > 0 and count > 1 else float("nan")
    return ppl, err


# ----------------------------------------------------------------------------- meshd


@dataclass
class Side:
    ppl: float
    err: float
    tokens: int  # the text's tokens (0: not known)
    chunks: int
    n_ctx: int
    scored: int
    seconds: float  # the whole evaluation (llama.cpp: the process, its load included)
    add_bos: bool | None

    def to_json(self) -> dict[str, Any]:
        run = self.chunks * self.n_ctx
        return {"ppl": self.ppl, "err": self.err, "tokens": self.tokens, "chunks": self.chunks,
                "scored": self.scored, "seconds": round(self.seconds, 2),
                "tokens_per_s": round(run / self.seconds, 1) if self.seconds > 0 else None,
                "add_bos": self.add_bos}


def meshd_tokens(model: Any, text: str) -> tuple[list[int], bool]:
    """The text's ids with the model's special tokens, and whether its tokenizer adds a BOS."""
    tok = model.tokenizer
    ids = tok.encode(text)
    bos = tok.bos_token_id
    add_bos = bos is not None and ids[:1] == [bos] and tok.encode(text, add_special_tokens=False)[:1] != [bos]
    return ids, add_bos


def meshd_perplexity(model: Any, tokens: list[int], add_bos: bool, n_ctx: int,
                     limit: int) -> Side:
    """The method above on a loaded meshd model (every layer), over ``tokens``."""
    if n_ctx > model.context_length:
        raise SystemExit(f"--ctx {n_ctx} is longer than the meshd model's context "
                         f"({model.context_length})")
    chunks = make_chunks(tokens, n_ctx, model.tokenizer.bos_token_id if add_bos else None, limit)
    if not chunks:
        raise SystemExit(f"the text has {len(tokens)} tokens: fewer than one chunk of {n_ctx}")
    first = n_ctx // 2
    stage = model.stage(0, model.num_layers)
    nll = nll2 = 0.0
    count = 0
    t0 = time.perf_counter()
    for i, chunk in enumerate(chunks):
        session = stage.open_session(max_tokens=n_ctx)
        try:
            ids = np.asarray(chunk, np.int64)
            session.step(ids[:first], np.arange(first), last_only=True)
            logits = session.step(ids[first:], np.arange(first, n_ctx), last_only=False)
        finally:
            session.free()
        a, b, c = chunk_nll(logits, chunk, first)
        nll, nll2, count = nll + a, nll2 + b, count + c
        print(f"  meshd [{i + 1}/{len(chunks)}] {math.exp(nll / count):.4f}", end="\r",
              file=sys.stderr, flush=True)
    seconds = time.perf_counter() - t0
    print(file=sys.stderr)
    ppl, err = estimate(nll, nll2, count)
    return Side(ppl, err, len(tokens), len(chunks), n_ctx, count, seconds, add_bos)


# ----------------------------------------------------------------------------- llama.cpp


FINAL = re.compile(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)")
CHUNKS = re.compile(r"calculating perplexity over (\d+) chunks")
TOKENIZED = re.compile(r"tokenizes to only (\d+) tokens")


def llama_tokens(gguf: Path, text: str) -> list[int]:
    """llama-tokenize's ids of ``text`` (the model's special tokens added, as perplexity does)."""
    exe = llama_bin("llama-tokenize")
    if exe is None:
        raise FileNotFoundError(missing_reason("llama-tokenize"))
    r = subprocess.run([str(exe), "-m", str(gguf), "--stdin", "--ids", "--log-disable",
                        "--no-escape"], input=text.encode("utf-8"), capture_output=True,
                       check=False, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"llama-tokenize failed: {r.stderr.decode(errors='replace')[-2000:]}")
    return [int(x) for x in json.loads(r.stdout.decode().strip().splitlines()[-1])]


def llama_perplexity(gguf: Path, text_file: Path, n_ctx: int, threads: int,
                     limit: int) -> tuple[Side, str]:
    args = ["-m", str(gguf), "-f", str(text_file), "-c", str(n_ctx), "-b", str(n_ctx),
            "-t", str(threads), "-tb", str(threads)]
    if limit >= 0:
        args += ["--chunks", str(limit)]
    t0 = time.perf_counter()
    r = run_tool("llama-perplexity", args, timeout_s=3600)
    seconds = time.perf_counter() - t0
    out = r.stdout + r.stderr
    m = FINAL.search(out)
    if r.returncode != 0 or m is None:
        raise RuntimeError(f"llama-perplexity failed ({r.returncode}):\n{out[-3000:]}")
    n_chunk = int(CHUNKS.search(out).group(1)) if CHUNKS.search(out) else 0
    first = n_ctx // 2
    side = Side(float(m.group(1)), float(m.group(2)), 0, n_chunk, n_ctx,
                n_chunk * (n_ctx - first - 1), seconds, None)
    return side, " ".join(["llama-perplexity", *args])


def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


# ----------------------------------------------------------------------------- main


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--meshd-model", type=Path, help="a meshd model directory")
    ap.add_argument("--gguf", type=Path,
                    help="the GGUF for llama-perplexity (and llama-tokenize's ids, compared)")
    ap.add_argument("--text", type=Path, default=DEFAULT_TEXT)
    ap.add_argument("--ctx", type=int, default=512, help="tokens per chunk (llama's -c)")
    ap.add_argument("--chunks", type=int, default=-1, help="at most this many chunks (-1: all)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens-from", choices=("own", "llama"), default="own",
                    help="the meshd side's ids: its own tokenizer's, or llama-tokenize's")
    ap.add_argument("--llama-json", type=Path,
                    help="take the llama.cpp figures from an earlier run's --out (same text, "
                         "--ctx, --chunks) instead of running llama-perplexity again")
    ap.add_argument("--accuracy-level", type=int, choices=(0, 1, 2, 3, 4),
                    help="a diagnostic: build meshd's graph with MatMulNBits at this accuracy "
                    "level instead of the engine's (4: int8 activations; 1: float32, much "
                    "slower to decode)")
    ap.add_argument("--label", default="")
    ap.add_argument("--out", type=Path, help="write the figures as JSON here")
    args = ap.parse_args()
    if args.meshd_model is None and args.gguf is None and args.llama_json is None:
        ap.error("give --meshd-model, --gguf (or --llama-json) or both")
    if args.ctx < 4 or args.ctx % 2:
        ap.error("--ctx must be an even number >= 4")
    text = read_text(args.text)
    res: dict[str, Any] = {"text": str(args.text.relative_to(ROOT) if args.text.is_relative_to(ROOT)
                                       else args.text),
                           "text_chars": len(text), "n_ctx": args.ctx, "threads": args.threads,
                           "chunks_limit": args.chunks, "label": args.label}
    llama_ids: list[int] | None = None
    if args.gguf is not None and llama_bin("llama-tokenize") is not None:
        llama_ids = llama_tokens(args.gguf, text)
        res["llama_tokens"] = len(llama_ids)
    if args.llama_json is not None:
        earlier = json.loads(args.llama_json.read_text())
        same = ("text", "text_chars", "n_ctx", "chunks_limit")
        if any(earlier.get(k) != res[k] for k in same) or "llama" not in earlier:
            ap.error(f"{args.llama_json} is not a llama-perplexity run over the same text, "
                     f"--ctx and --chunks")
        res["llama"] = {**earlier["llama"], "from": str(args.llama_json)}
        print(f"llama.cpp  PPL {res['llama']['ppl']:.4f} +/- {res['llama']['err']:.5f}  "
              f"(from {args.llama_json})", flush=True)
    elif args.gguf is not None:
        side, cmd = llama_perplexity(args.gguf, args.text, args.ctx, args.threads, args.chunks)
        if llama_ids is not None:
            side.tokens = len(llama_ids)
        res["llama"] = {**side.to_json(), "gguf": str(args.gguf), "command": cmd}
        print(f"llama.cpp  PPL {side.ppl:.4f} +/- {side.err:.5f}  ({side.chunks} chunks, "
              f"{side.seconds:.1f} s)", flush=True)
    if args.meshd_model is not None:
        from meshd.engine import load_model

        if args.accuracy_level is not None:  # rebuild the graph rather than load the model's
            from meshd.engine import graph, runtime

            graph.ACCURACY_LEVEL = args.accuracy_level
            runtime._prebuilt = lambda *_a, **_k: None  # type: ignore[assignment]
            res["accuracy_level"] = args.accuracy_level
        model = load_model(args.meshd_model, threads=args.threads)
        from meshd.engine import q4kernel

        # whether 4-bit blocks with minimums ran on meshd's kernel
        res["q4_kernel"] = q4kernel.status().label
        own, add_bos = meshd_tokens(model, text)
        tokens = own
        if llama_ids is not None:
            diff = first_difference(own, llama_ids)
            res["tokenizers_agree"] = diff is None
            res["first_token_difference"] = diff
            if diff is not None:
                print(f"tokenizers differ: meshd {len(own)} tokens, llama.cpp {len(llama_ids)}, "
                      f"first difference at token {diff}")
        if args.tokens_from == "llama":
            if llama_ids is None:
                ap.error("--tokens-from llama needs --gguf and a built llama-tokenize")
            tokens = llama_ids
        side = meshd_perplexity(model, tokens, add_bos, args.ctx, args.chunks)
        res["meshd"] = {**side.to_json(), "model": str(args.meshd_model),
                        "tokens_from": args.tokens_from}
        print(f"meshd      PPL {side.ppl:.4f} +/- {side.err:.5f}  ({side.chunks} chunks, "
              f"{side.seconds:.1f} s)", flush=True)
    if "llama" in res and "meshd" in res:
        ratio = res["meshd"]["ppl"] / res["llama"]["ppl"]
        res["ratio_meshd_over_llama"] = ratio
        print("\n| side | PPL | +/- | chunks x n_ctx | scored tokens | s |\n|---|---|---|---|---|---|")
        for name in ("llama", "meshd"):
            s = res[name]
            print(f"| {name} | {s['ppl']:.4f} | {s['err']:.4f} | {s['chunks']} x {args.ctx} | "
                  f"{s['scored']} | {s['seconds']:.1f} |")
        print(f"\nmeshd / llama.cpp perplexity: {ratio:.4f}")
    res["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                   text=True, check=False, cwd=ROOT).stdout.strip()
    res["machine"] = {"cpus": os.cpu_count(), "python": platform.python_version(),
                      "load_avg": os.getloadavg(), "cpu": cpu_features()}
    if args.out:
        args.out.write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
