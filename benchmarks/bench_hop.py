"""Tokens/s one forwarding hop can stream (routing issue's figure), on real daemons over loopback.

Two daemons: ``entry`` serves no model and forwards over its long-lived request stream to
``server``, which serves a tiny random Llama (1 layer, hidden 32, a 4,096-token context) so
that the engine is as fast as this machine allows. In one script, alternating rounds:

* ``local``: long greedy generations submitted at ``server`` (no hop): the engine-bound baseline;
* ``hop``: the very same requests submitted at ``entry`` and forwarded one hop to ``server``;
* with ``--streams K`` > 1, K such generations at once: the aggregate tokens/s over one peer link.

Tokens/s is what the client receives: tokens from the first to the last one over that time
(``decode``), and tokens over the whole request (``e2e``). The script also reads each daemon's
CPU time (``/proc``) around every round: the entry daemon's CPU per forwarded token is what the
hop itself costs, and ``1e6 / (entry us per token)`` is how many tokens/s one core could forward
if the engine were not on the same two cores (a capacity bound, printed as such).

    .venv/bin/python benchmarks/bench_hop.py [--tokens 2000] [--repeats 5] [--streams 1,4]
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

PROMPT = "a long story about the mesh"
CLK_TCK = os.sysconf("SC_CLK_TCK")


def tiny_model(base: Path, seed: int) -> Path:
    """1 layer, hidden 32, vocab 320, 4,096 positions: far faster than the hop it feeds."""
    from hf_fixtures import make_checkpoint

    from meshd.engine import import_hf

    make_checkpoint(base / "hf", layers=1, hidden=32, intermediate=48, max_pos=4096, seed=seed)
    import_hf(base / "hf", base / "model", stages=1, name="hop")
    return base / "model"


def cpu_s(pid: int) -> float:
    """User plus system CPU seconds of a process so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


async def submit(sock: str, max_tokens: int) -> dict[str, Any]:
    fields = {"rid": uuid.uuid4().hex[:16], "prompt": PROMPT, "max_tokens": max_tokens,
              "temperature": 0.0}
    n = frames = 0
    t0 = time.perf_counter()
    first = last = 0.0
    async with aclosing(submit_events(sock, fields, recv_timeout_s=120)) as events:
        async for msg in events:
            if msg["t"] == MessageType.TOKENS:
                last = time.perf_counter()
                if not n:
                    first = last
                n += len(msg["ids"])
                frames += 1
            elif msg["t"] == MessageType.DONE:
                return {"route": msg["stats"]["route"], "received": n, "frames": frames,
                        "t0": t0, "first": first, "last": last, "end": time.perf_counter()}
    raise SystemExit("the request ended without a DONE frame")


async def round_(sock: str, streams: int, tokens: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []

    async def one() -> None:
        out.append(await submit(sock, tokens))

    async with trio.open_nursery() as nursery:
        for _ in range(streams):
            nursery.start_soon(one)
    return out


def measure(sock: str, kind: str, streams: int, tokens: int, pids: dict[str, int]) -> dict[str, float]:
    before = {k: cpu_s(p) for k, p in pids.items()}
    rs = trio.run(round_, sock, streams, tokens)
    after = {k: cpu_s(p) for k, p in pids.items()}
    expect = ["server"] if kind == "local" else ["entry", "server"]
    for r in rs:
        if r["route"] != expect:
            raise SystemExit(f"unexpected route {r['route']} for {kind}")
        if r["received"] != tokens:
            raise SystemExit(f"a generation ended after {r['received']} of {tokens} tokens "
                             "(the random model met its end token): try another --seed")
    total = sum(r["received"] for r in rs)
    t0 = min(r["t0"] for r in rs)
    first = min(r["first"] for r in rs)
    last = max(r["last"] for r in rs)
    end = max(r["end"] for r in rs)
    res = {
        "decode_tok_s": (total - streams) / (last - first) if last > first else 0.0,
        "e2e_tok_s": total / (end - t0),
        "frames": sum(r["frames"] for r in rs),
        "tokens_per_frame": total / max(sum(r["frames"] for r in rs), 1),
    }
    for k in pids:
        res[f"{k}_cpu_us_per_token"] = (after[k] - before[k]) / total * 1e6
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=2000, help="tokens per generation (<= 4000)")
    ap.add_argument("--repeats", type=int, default=5, help="rounds per path and stream count (median)")
    ap.add_argument("--streams", default="1,4", help="concurrent generations per round, comma list")
    ap.add_argument("--seed", type=int, default=1, help="random model's seed (greedy must not end early)")
    ap.add_argument("--model", help="model directory (default: a tiny random Llama)")
    ap.add_argument("--out", help="also write the figures as JSON")
    args = ap.parse_args()
    counts = [int(x) for x in args.streams.split(",")]
    print(f"# {' '.join([Path(sys.executable).name, *sys.argv])}")
    print(f"# python {platform.python_version()}, {os.cpu_count()} cores, {platform.machine()}, "
          f"load {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    base = Path(tempfile.mkdtemp(prefix="meshd-bench-hop-"))
    results: dict[str, Any] = {"tokens": args.tokens, "repeats": args.repeats, "rounds": {}}
    try:
        model = Path(args.model) if args.model else tiny_model(base, args.seed)
        served = {"path": str(model.resolve()), "max_concurrency": max(counts), "max_queue": 64}
        specs = [launcher.NodeSpec(name="entry", models=[]),
                 launcher.NodeSpec(name="server", models=[served])]
        index = launcher.up(base / "net", specs, advert_interval_s=2.0)
        try:
            socks = {"hop": index["nodes"][0]["socket"], "local": index["nodes"][1]["socket"]}
            pids = {n["name"]: int(n["pid"]) for n in index["nodes"]}
            for kind in ("local", "hop"):  # warm both paths: sessions, caches, the channel
                measure(socks[kind], kind, 1, 200, pids)
            for k in counts:
                rounds: dict[str, list[dict[str, float]]] = {"local": [], "hop": []}
                for i in range(args.repeats):
                    for kind in (("local", "hop") if i % 2 == 0 else ("hop", "local")):
                        rounds[kind].append(measure(socks[kind], kind, k, args.tokens, pids))
                results["rounds"][str(k)] = rounds
                med = {kind: {f: statistics.median(r[f] for r in rs) for f in rs[0]}
                       for kind, rs in rounds.items()}
                results.setdefault("median", {})[str(k)] = med
                h, lo = med["hop"], med["local"]
                print(f"{k} stream(s) x {args.tokens} tokens, median of {args.repeats}:")
                for kind in ("local", "hop"):
                    m = med[kind]
                    each = ", ".join(f"{r['decode_tok_s']:.0f}" for r in rounds[kind])
                    print(f"  {kind:>5}: decode {m['decode_tok_s']:6.0f} tok/s (rounds: {each}), "
                          f"e2e {m['e2e_tok_s']:6.0f} tok/s, {m['tokens_per_frame']:.1f} tokens/frame, "
                          f"CPU us/token: entry {m['entry_cpu_us_per_token']:.1f}, "
                          f"server {m['server_cpu_us_per_token']:.1f}")
                ratio = h["decode_tok_s"] / lo["decode_tok_s"]
                bound = 1e6 / h["entry_cpu_us_per_token"] if h["entry_cpu_us_per_token"] > 0 else float("inf")
                print(f"  hop/local decode tok/s: {ratio:.3f}; the entry daemon spends "
                      f"{h['entry_cpu_us_per_token']:.1f} us CPU per forwarded token "
                      f"(one core could forward ~{bound:,.0f} tok/s)")
                results["median"][str(k)]["hop_over_local"] = ratio
                results["median"][str(k)]["entry_core_bound_tok_s"] = bound
        finally:
            launcher.down(base / "net")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
