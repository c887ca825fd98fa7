"""`meshd embed`: sentence embeddings computed in this process (no daemon needed)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from meshd.exitcodes import Exit

DESCRIPTION = """\
Embed text with the node's sentence encoder (all-MiniLM-L6-v2 by default, from the
meshd[edge] extra; imported into ~/.cache/meshd on first use). Runs here, without a daemon.

  meshd embed "How do I reset my password?"
  meshd embed --json "first text" "second text"      # one JSON object per line
"""


def register(sub: Any) -> None:
    p = sub.add_parser("embed", help="sentence embeddings, computed locally",
                       description=DESCRIPTION,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("texts", nargs="+", metavar="TEXT")
    p.add_argument("--model", type=Path, default=None, metavar="DIR",
                   help="an embedding model directory (meshd model import of a BERT "
                   "checkpoint); default: all-MiniLM-L6-v2")
    p.add_argument("--threads", type=int, default=None, help="onnxruntime intra-op threads")
    p.add_argument("--int8", action="store_true",
                   help="use the model's int8 graph: about half the CPU, vectors within cosine "
                   "~0.97 of the float ones (docs/embeddings.md)")
    p.add_argument("--json", action="store_true",
                   help='print {"model": ..., "embedding": [...]} per text, one per line')
    p.set_defaults(func=cmd_embed)


def cmd_embed(args: argparse.Namespace) -> int:
    from meshd.embed import load_embedder

    t0 = time.perf_counter()
    emb = load_embedder(args.model, threads=args.threads, spin=False,  # one-shot: no twin session
                        precision="int8" if args.int8 else "fp32")
    t1 = time.perf_counter()
    vectors = emb.embed(args.texts)
    t2 = time.perf_counter()
    for text, vec in zip(args.texts, vectors, strict=True):
        if args.json:
            print(json.dumps({"model": emb.name, "embedding": [float(x) for x in vec]}))
        else:
            head = ", ".join(f"{x:+.4f}" for x in vec[:6])
            print(f"{emb.name} [{emb.dim}{', int8' if args.int8 else ''}]: [{head}, ...]  "
                  f"{text[:60]!r}")
    if not args.json:
        print(f"[{len(args.texts)} texts, load {(t1 - t0) * 1e3:.0f} ms, embed "
              f"{(t2 - t1) * 1e3:.1f} ms, {emb.provider}]", file=sys.stderr)
    return Exit.OK
