"""Edge tokenization (issue 15): bytes on the wire per request, and entry-to-first-token time,
with the prompt forwarded as text or as packed token ids, per kind of text.

Corpus: ``benchmarks/data/edge_corpus.json`` (English prose and Greek, Russian and Chinese text
written for it, Python source of this repository) plus RAG-style prompts assembled here: a
question over six passages of that corpus, 4-9 thousand characters each.

1. **Bytes per request** (no daemons): each prompt as the REQ an entry node sends a peer, built
   by meshd's own code (``EntryContext.wire_fields``/``packed_prompt`` and
   ``execute.req_fields``) and framed by ``meshd.core.wire.frame`` (4-byte length included;
   Noise and yamux overhead not counted): the text (what an entry without the model forwarded
   before), the packed ids (now), and the msgpack list of ids (``prompt_ids``, what an entry
   serving the model sends an older peer). Ids come from the shipped model's tokenizer.
2. **Entry-to-first-token** on real daemons over loopback: ``srv`` serves the shipped model
   (tiny-en, its context stretched from 256 to 8,192 positions so that the long prompts fit:
   RoPE extrapolates, the output is nonsense past 256 and the timing is what counts); ``ids``
   and ``text`` serve nothing and forward to ``srv``, ``text`` with ``edge_tokenize = false``.
   Every prompt goes to both, alternately, ``--repeats`` times; the time is from the client's
   SUBMIT on the entry's control socket to the first TOKENS frame (so the entry's own
   tokenizing counts), one token asked, greedy.

    .venv/bin/python benchmarks/bench_edge_tokens.py [--repeats 5] [--model DIR] [--out FILE.json]

``--model DIR`` takes another meshd model directory (its tokenizer for the bytes, the model for
the mesh, stretched to at least 8,192 positions likewise).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from contextlib import aclosing
from pathlib import Path
from typing import Any

# the daemons this benchmark starts answer from a model, never from the semantic cache
os.environ.setdefault("MESHD_TESTNET_CACHE", "0")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import trio  # noqa: E402

from meshd.control.client import call, submit_events  # noqa: E402
from meshd.core.messages import MessageType  # noqa: E402
from meshd.core.packing import dtype_for  # noqa: E402
from meshd.core.request import parse_submit  # noqa: E402
from meshd.core.wire import frame  # noqa: E402
from meshd.engine import default_model_path  # noqa: E402
from meshd.engine.manifest import read_manifest  # noqa: E402
from meshd.engine.tokenizer import Tokenizer  # noqa: E402
from meshd.node.entry.context import EntryContext  # noqa: E402
from meshd.node.entry.execute import req_fields  # noqa: E402
from meshd.testnet import launcher  # noqa: E402

CORPUS = ROOT / "benchmarks" / "data" / "edge_corpus.json"
KINDS = ("english", "code", "nonlatin", "rag")
CONTEXT = 8192
ORIGIN = "12D3KooW" + "x" * 44  # a peer id's length


def load_corpus() -> dict[str, list[str]]:
    data = json.loads(CORPUS.read_text())
    english = list(data["english"])
    code = [c["text"] for c in data["code"]]
    nonlatin = [c["text"] for c in data["nonlatin"]]
    passages = english + [c["text"].split("\n\n", 1)[1] for c in data["code"]]
    questions = ["Which passage explains how to retry a failed request?",
                 "What does the budget function do when the prompt is too long?",
                 "Summarise what these documents say about waiting.",
                 "Which of these texts describes a town in winter?"]
    rag = []
    for i, q in enumerate(questions):
        docs = [passages[(i * 3 + k * 2) % len(passages)] for k in range(6)]
        body = "\n\n".join(f"[{k + 1}] {d}" for k, d in enumerate(docs))
        rag.append("Answer the question using only the documents below, and cite them by "
                   f"number.\n\nDocuments:\n{body}\n\nQuestion: {q}\nAnswer:")
    return {"english": english, "code": code, "nonlatin": nonlatin, "rag": rag}


def tokenizer(path: Path) -> Tokenizer:
    info = read_manifest(path).tokenizer
    return Tokenizer(path / info.file, info)


def wire_bytes(prompt: str, tok: Tokenizer) -> dict[str, int]:
    """Bytes of the REQ frame for ``prompt`` as text, packed ids, and a list of ids."""
    req = parse_submit({"prompt": prompt, "max_tokens": 1, "temperature": 0.0},
                       lambda: uuid.uuid4().hex[:16])

    def journal(kind: str, payload: dict[str, Any]) -> None:
        pass

    async def emit(kind: str, payload: dict[str, Any]) -> None:
        pass

    ctx = EntryContext(req, emit, journal, model="model", max_tokens=1)
    text = req_fields(ctx.wire_fields(), [], {}, [], deadline_ms=120_000, origin=ORIGIN)
    ctx.prompt_ids = tok.encode_prompt(prompt)
    ctx.tokenizer = "0" * 64
    ctx.vocab_size = tok.vocab_size
    packed = req_fields(ctx.wire_fields(), ctx.prompt_ids, ctx.packed_prompt(), [],
                        deadline_ms=120_000, origin=ORIGIN)
    listed = req_fields(ctx.wire_fields(), ctx.prompt_ids, {}, [], deadline_ms=120_000,
                        origin=ORIGIN)
    return {"chars": len(prompt), "utf8": len(prompt.encode()), "tokens": len(ctx.prompt_ids),
            "text": len(frame(MessageType.REQ, text)),
            "packed": len(frame(MessageType.REQ, packed)),
            "list": len(frame(MessageType.REQ, listed))}


def stretched_model(source: Path, base: Path) -> Path:
    """The model with its context stretched to at least ``CONTEXT`` positions."""
    out = base / "model"
    shutil.copytree(source, out)
    manifest = json.loads((out / "manifest.json").read_text())
    arch = manifest["architecture"]
    arch["max_position_embeddings"] = max(CONTEXT, arch["max_position_embeddings"])
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return out


async def first_token(sock: str, prompt: str) -> float:
    fields = {"rid": uuid.uuid4().hex[:16], "prompt": prompt, "max_tokens": 1, "temperature": 0.0}
    t0 = time.perf_counter()
    async with aclosing(submit_events(sock, fields, recv_timeout_s=120)) as events:
        async for msg in events:
            if msg["t"] == MessageType.TOKENS:
                return (time.perf_counter() - t0) * 1000.0
            if msg["t"] == MessageType.DONE:
                break
    raise SystemExit("the request ended without a token")


async def status(sock: str) -> dict[str, Any]:
    reply = await call(sock, MessageType.STATUS_REQ, {})
    return dict(reply["data"]["services"])


async def ttft(socks: dict[str, str], srv: str, corpus: dict[str, list[str]],
               repeats: int) -> dict[str, dict[str, list[float]]]:
    with trio.fail_after(60):  # the ids entry prefetches the tokenizer srv advertises
        while not (await status(socks["ids"]))["tokenizers"]["held"]:
            await trio.sleep(0.2)
    for path in ("ids", "text"):  # warm both paths
        for _ in range(3):
            await first_token(socks[path], corpus["english"][0])
    before = (await status(srv))["request_server"]
    out: dict[str, dict[str, list[float]]] = {k: {"ids": [], "text": []} for k in corpus}
    for r in range(repeats):
        for kind, prompts in corpus.items():
            for i, p in enumerate(prompts):
                order = ("ids", "text") if (r + i) % 2 == 0 else ("text", "ids")
                for path in order:
                    out[kind][path].append(await first_token(socks[path], p))
    after = (await status(srv))["request_server"]
    n = repeats * sum(len(p) for p in corpus.values())
    got = {k: after[k] - before[k] for k in ("prompts_packed", "prompts_text", "prompts_ids")}
    if got != {"prompts_packed": n, "prompts_text": n, "prompts_ids": 0}:
        raise SystemExit(f"the server did not see what was expected: {got}, n={n}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5, help="first-token samples per prompt and path")
    ap.add_argument("--no-mesh", action="store_true", help="wire bytes only")
    ap.add_argument("--model", help="a meshd model directory (default: the shipped tiny-en)")
    ap.add_argument("--out", help="write the figures here as JSON")
    args = ap.parse_args()
    print(f"# {' '.join([Path(sys.executable).name, *sys.argv])}")
    print(f"# python {platform.python_version()}, {os.cpu_count()} cores, {platform.machine()}")
    corpus = load_corpus()
    source = Path(args.model) if args.model else default_model_path()
    tok = tokenizer(source)
    name = read_manifest(source).name
    res: dict[str, Any] = {"wire": {}, "ttft": {}, "model": name}
    print(f"\nbytes of one REQ frame, {name}'s tokenizer (vocabulary {tok.vocab_size}: "
          f"{dtype_for(tok.vocab_size)} ids)")
    print(f"{'kind':9} {'n':>2} {'chars':>6} {'tokens':>6} {'text B':>7} {'packed B':>8} "
          f"{'list B':>7} {'text/packed':>11} {'list/packed':>11} {'B/token':>7}")
    for kind in KINDS:
        rows = [wire_bytes(p, tok) for p in corpus[kind]]
        tot = {k: sum(r[k] for r in rows) for k in rows[0]}
        res["wire"][kind] = {**tot, "n": len(rows), "text_over_packed": tot["text"] / tot["packed"],
                             "list_over_packed": tot["list"] / tot["packed"]}
        print(f"{kind:9} {len(rows):>2} {tot['chars'] / len(rows):>6.0f} "
              f"{tot['tokens'] / len(rows):>6.0f} {tot['text'] / len(rows):>7.0f} "
              f"{tot['packed'] / len(rows):>8.0f} {tot['list'] / len(rows):>7.0f} "
              f"{tot['text'] / tot['packed']:>11.2f} {tot['list'] / tot['packed']:>11.2f} "
              f"{tot['utf8'] / tot['tokens']:>7.2f}")
    print("(per-request means; ratios of the totals; B/token = UTF-8 bytes of text per token)")
    if args.no_mesh:
        return _write(args.out, res)
    base = Path(tempfile.mkdtemp(prefix="meshd-bench-edgetok-"))
    try:
        model = stretched_model(source, base)
        # a prefill of the longest prompts takes seconds on a small shared box: the first token
        # may take longer than the default 20 s there without anything being wrong
        slow = {"first_token_timeout_s": 120.0}
        specs = [launcher.NodeSpec(name="srv", models=[{"path": str(model), "max_concurrency": 1}]),
                 launcher.NodeSpec(name="ids", models=[], extra={"routing": slow}),
                 launcher.NodeSpec(name="text", models=[],
                                   extra={"routing": {**slow, "edge_tokenize": False}})]
        index = launcher.up(base / "net", specs, advert_interval_s=2.0)
        try:
            socks = {n["name"]: n["socket"] for n in index["nodes"]}
            times = trio.run(ttft, socks, socks["srv"], corpus, args.repeats)
        except BaseException:
            for n in index["nodes"]:  # the daemons' own account, before their folder goes
                log = Path(n["dir"]) / "meshd.log"
                tail = log.read_text(errors="replace").splitlines()[-15:] if log.exists() else []
                print(f"--- {n['name']} log tail\n" + "\n".join(tail), file=sys.stderr)
            raise
        finally:
            launcher.down(base / "net")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(f"\nentry-to-first-token through 3 daemons on loopback (srv serves {name} stretched to "
          f"{CONTEXT} positions), ms, median (p90), {args.repeats} samples per prompt and path")
    print(f"{'kind':9} {'samples':>7} {'text forwarded':>16} {'ids forwarded':>16} {'ids/text':>8}")
    for kind in KINDS:
        t, i = times[kind]["text"], times[kind]["ids"]
        mt, mi = statistics.median(t), statistics.median(i)
        res["ttft"][kind] = {"text_p50_ms": round(mt, 2), "ids_p50_ms": round(mi, 2),
                             "text_p90_ms": round(_pct(t, 0.9), 2), "ids_p90_ms": round(_pct(i, 0.9), 2),
                             "ids_over_text": round(mi / mt, 3), "samples": len(t)}
        print(f"{kind:9} {len(t):>7} {mt:>8.2f} ({_pct(t, 0.9):>6.2f}) {mi:>8.2f} "
              f"({_pct(i, 0.9):>6.2f}) {mi / mt:>8.3f}")
    return _write(args.out, res)


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def _write(out: str | None, res: dict[str, Any]) -> int:
    if out:
        Path(out).write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
