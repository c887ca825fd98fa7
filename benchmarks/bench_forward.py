"""What one forwarding hop costs (routing issue's figures), on real daemons over loopback.

Two daemons: ``entry`` serves no model, ``server`` serves it. The same requests are submitted
alternately at ``server`` (served locally, no hop) and at ``entry`` (forwarded over its
long-lived request stream to ``server``), so both see the same machine state.

* first token: the daemons' own ``ttft_ms`` (from the daemon receiving the submit to the first
  token it passes on, control socket excluded): p50/p90 through the hop, locally, and the
  difference of medians = the time a forward adds per hop (goal: under 3 ms at p50);
* streaming: K concurrent long generations; tokens/s the client receives through the hop, and
  served locally (goal: one hop carries at least 5,000 tokens/s; tokens travel coalesced, one
  frame per ~10 ms per request).

The model is a tiny random Llama (hidden 32, 4 layers) so that the engine outpaces the hop and
the hop is what is measured; pass ``--model DIR`` to use another.

    .venv/bin/python benchmarks/bench_forward.py [--requests 60] [--streams 8] [--tokens 200]
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
sys.path.insert(0, str(ROOT / "tests" / "engine"))

import trio  # noqa: E402

from meshd.control.client import submit_events  # noqa: E402
from meshd.core.messages import MessageType  # noqa: E402
from meshd.testnet import launcher  # noqa: E402


def tiny_model(base: Path) -> Path:
    from hf_fixtures import make_checkpoint

    from meshd.engine import import_hf

    make_checkpoint(base / "hf", layers=4, hidden=32, seed=7)
    import_hf(base / "hf", base / "model", stages=1, name="tiny")
    return base / "model"


async def submit(sock: str, max_tokens: int, prompt: str) -> dict[str, Any]:
    fields = {"rid": uuid.uuid4().hex[:16], "prompt": prompt, "max_tokens": max_tokens,
              "temperature": 0.0}
    n = 0
    async with aclosing(submit_events(sock, fields, recv_timeout_s=120)) as events:
        async for msg in events:
            if msg["t"] == MessageType.TOKENS:
                n += len(msg["ids"])
            elif msg["t"] == MessageType.DONE:
                return {**msg["stats"], "received": n}
    raise SystemExit("the request ended without a DONE frame")


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


async def first_token(socks: dict[str, str], n: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"hop": [], "local": []}
    for i in range(n):
        for kind in (("hop", "local") if i % 2 == 0 else ("local", "hop")):
            r = await submit(socks[kind], 4, f"hello mesh number {i}")
            expect = ["server"] if kind == "local" else ["entry", "server"]
            if r["route"] != expect:
                raise SystemExit(f"unexpected route {r['route']} for {kind}")
            out[kind].append(float(r["ttft_ms"]))
    return out


async def streaming(sock: str, streams: int, tokens: int) -> dict[str, float]:
    counts: list[int] = []

    async def one(i: int) -> None:
        r = await submit(sock, tokens, f"a long story number {i}")
        counts.append(int(r["received"]))

    t0 = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for i in range(streams):
            nursery.start_soon(one, i)
    wall = time.perf_counter() - t0
    return {"tokens": sum(counts), "wall_s": wall, "tokens_per_s": sum(counts) / wall}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=60, help="first-token samples per path")
    ap.add_argument("--streams", type=int, default=8, help="concurrent generations")
    ap.add_argument("--tokens", type=int, default=200, help="tokens per generation")
    ap.add_argument("--rounds", type=int, default=3, help="streaming rounds per path (median)")
    ap.add_argument("--model", help="model directory (default: a tiny random Llama)")
    ap.add_argument("--out")
    args = ap.parse_args()
    print(f"# {' '.join([Path(sys.executable).name, *sys.argv])}")
    print(f"# python {platform.python_version()}, {os.cpu_count()} cores, {platform.machine()}")
    base = Path(tempfile.mkdtemp(prefix="meshd-bench-fwd-"))
    try:
        model = Path(args.model) if args.model else tiny_model(base)
        served = {"path": str(model.resolve()), "max_concurrency": args.streams, "max_queue": 64}
        specs = [launcher.NodeSpec(name="entry", models=[]),
                 launcher.NodeSpec(name="server", models=[served])]
        index = launcher.up(base / "net", specs, advert_interval_s=2.0)
        try:
            socks = {"hop": index["nodes"][0]["socket"], "local": index["nodes"][1]["socket"]}
            trio.run(first_token, socks, 5)  # warm both paths (sessions, caches, channel)
            ft = trio.run(first_token, socks, args.requests)
            rounds: dict[str, list[float]] = {"hop": [], "local": []}
            for _ in range(args.rounds):
                for kind in ("local", "hop"):
                    rounds[kind].append(trio.run(streaming, socks[kind], args.streams, args.tokens)["tokens_per_s"])
        finally:
            launcher.down(base / "net")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    res = {
        "ttft_hop_p50_ms": round(statistics.median(ft["hop"]), 2),
        "ttft_hop_p90_ms": round(pct(ft["hop"], 0.9), 2),
        "ttft_local_p50_ms": round(statistics.median(ft["local"]), 2),
        "ttft_local_p90_ms": round(pct(ft["local"], 0.9), 2),
        "hop_adds_p50_ms": round(statistics.median(ft["hop"]) - statistics.median(ft["local"]), 2),
        "stream_hop_tokens_per_s": round(statistics.median(rounds["hop"]), 0),
        "stream_local_tokens_per_s": round(statistics.median(rounds["local"]), 0),
        "streams": args.streams,
        "samples": args.requests,
    }
    res["stream_hop_over_local"] = round(res["stream_hop_tokens_per_s"] / res["stream_local_tokens_per_s"], 3)
    print(f"first token (n={args.requests} each): through one hop p50 {res['ttft_hop_p50_ms']} ms "
          f"(p90 {res['ttft_hop_p90_ms']}), local p50 {res['ttft_local_p50_ms']} ms "
          f"(p90 {res['ttft_local_p90_ms']}): a hop adds {res['hop_adds_p50_ms']} ms at p50")
    print(f"streaming ({args.streams} concurrent x {args.tokens} tokens, median of {args.rounds}): "
          f"through one hop {res['stream_hop_tokens_per_s']:.0f} tokens/s, local "
          f"{res['stream_local_tokens_per_s']:.0f} tokens/s (ratio {res['stream_hop_over_local']})")
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
