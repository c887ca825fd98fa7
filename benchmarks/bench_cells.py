"""Issue 19's cells benchmark: per-node gossip traffic, CPU and routing quality of real daemons
with cells against the flat advert topic, at the same size, on loopback.

    .venv/bin/python benchmarks/bench_cells.py [--nodes 40] [--cells 4] [--modes flat,cells]
        [--idle-s 60] [--load 0.7] [--duration-s 60] [--advert-interval-s 5] [--out FILE.json]

For each mode it starts ``--nodes`` daemons (node i in region ``r{i % cells}``; with cells on,
``[gossip] cells = "label"``, so each region is a cell), all serving the shipped model with
their decode capped (``benchmarks/loadgen.py``: the mesh's capacity is a property of the config,
not of how busy the shared machine is), waits until the mesh has formed (flat: every node lists
every other; cells: every node lists its cell-mates and knows every cell), then measures:

* **idle**: for ``--idle-s`` seconds, every daemon's gossip bytes received (the ``bytes_in``
  counter of its gossip streams: adverts, summaries, revocations, gossipsub control) plus the
  probe answers and pulled adverts it received over request channels, and its CPU time
  (``/proc/PID/stat``);
* **load**: open-loop Poisson arrivals at ``--load`` x capacity for ``--duration-s`` seconds,
  each through a uniformly drawn entry node, the same seeded arrivals in both modes; TTFT
  p50/p95/p99, and the same traffic and CPU figures over the run.

It prints one table per phase with medians over the nodes and the cells/flat ratios (the goals:
gossip bytes/s and CPU at most 0.4x the flat topic's, p95 TTFT within 1.2x), and ``--out``
writes every figure as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

os.environ.setdefault("MESHD_TESTNET_CACHE", "0")  # answers from the model, never the cache
os.environ.setdefault("PY_YAMUX_RELEASE_ON_READ", "0")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from loadgen import (  # noqa: E402
    SLOTS,
    arrivals,
    ask_all,
    attempt,
    capacity_rps,
    log,
    machine_note,
    percentile,
    request_fields,
)

from meshd.core.messages import MessageType  # noqa: E402
from meshd.testnet.launcher import NodeSpec, down, up  # noqa: E402

FORM_TIMEOUT_S = 600.0


def cpu_s(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as f:
            parts = f.read().rsplit(")", 1)[1].split()
        return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def specs_for(n: int, cells: int, mode: str, args: argparse.Namespace) -> list[NodeSpec]:
    out = []
    for i in range(n):
        s = NodeSpec(name=f"n{i:02d}", region=f"r{i % cells}")
        s.models = [{"path": "default", "max_concurrency": SLOTS, "max_decode_tokens_per_s": args.cap}]
        if args.reach:
            # the shipped model again under the cell's own name: only that cell's nodes serve it,
            # so another cell's node reaches it through the summaries and the probes
            s.models.append({"path": "default", "name": f"cell-{s.region}", "max_concurrency": 1})
        # a saturated shared box starves daemons for seconds: tolerant liveness in both modes
        gossip: dict[str, Any] = {"advert_interval_s": args.advert_interval_s,
                                  "ping_interval_s": args.ping_interval_s,
                                  "stream_idle_timeout_s": 3 * args.ping_interval_s,
                                  "stall_timeout_s": args.stall_timeout_s,
                                  "busy_ping_after_s": min(5.0, args.stall_timeout_s)}
        if mode == "cells":
            gossip["cells"] = "label"
            if args.summary_interval_s:
                gossip["summary_interval_s"] = args.summary_interval_s
        s.extra = {"gossip": gossip}
        out.append(s)
    return out


async def coverage(socks: dict[str, str], mode: str, n: int, cells: int) -> float:
    """The mean share of what each node should know that it knows: every other node (flat), or
    its cell-mates and every cell (cells)."""
    peers = await ask_all(socks, MessageType.PEERS_REQ, 10.0)
    sts = await ask_all(socks, MessageType.STATUS_REQ, 10.0) if mode == "cells" else {}
    shares = []
    for name in socks:
        p = peers.get(name)
        if p is None:
            shares.append(0.0)
            continue
        mates = [r for r in p["peers"] if r.get("known_by", "advert") == "advert"]
        if mode == "flat":
            shares.append(min(1.0, len(mates) / (n - 1)))
            continue
        st = sts.get(name)
        known = len(st["data"]["services"]["cells"].get("cells", {})) if st is not None else 0
        shares.append(min(1.0, len(mates) / max(1, n // cells - 1)) * min(1.0, known / cells))
    return statistics.mean(shares)


async def counters(socks: dict[str, str], pids: dict[str, int]) -> dict[str, dict[str, float]]:
    """Per node: gossip bytes received, probe answer bytes received, CPU seconds, now."""
    sts = await ask_all(socks, MessageType.STATUS_REQ, 10.0)
    out = {}
    for name, st in sts.items():
        if st is None:
            continue
        svc = st["data"]["services"]
        out[name] = {"gossip": float(svc["gossip"].get("bytes_in", 0)),
                     # probe answers (cells) and pulled adverts (gossip fell silent): advert
                     # traffic over request channels
                     "probe": float((svc.get("cells") or {}).get("probe_bytes_in", 0))
                     + float(svc["links"].get("pull_bytes_in", 0)),
                     "cpu": cpu_s(pids[name]), "t": time.monotonic(),
                     "channels": float(svc["links"].get("channels", 0))}
    return out


def rates(a: dict[str, dict[str, float]], b: dict[str, dict[str, float]]) -> dict[str, float]:
    per_bytes, per_cpu = [], []
    for name in a.keys() & b.keys():
        dt = b[name]["t"] - a[name]["t"]
        per_bytes.append((b[name]["gossip"] + b[name]["probe"] - a[name]["gossip"] - a[name]["probe"]) / dt)
        per_cpu.append((b[name]["cpu"] - a[name]["cpu"]) / dt * 100.0)
    return {"nodes": len(per_bytes),
            "bytes_per_node_s_median": statistics.median(per_bytes), "bytes_per_node_s_mean": statistics.mean(per_bytes),
            "cpu_pct_median": statistics.median(per_cpu), "cpu_pct_mean": statistics.mean(per_cpu),
            "probe_bytes_per_node_s_mean": statistics.mean(
                (b[k]["probe"] - a[k]["probe"]) / (b[k]["t"] - a[k]["t"]) for k in a.keys() & b.keys()),
            # open request channels (one per linked peer) at the end of the window
            "channels_median": statistics.median(b[k].get("channels", 0.0) for k in b)}


async def reach(socks: dict[str, str], cells: int, concurrency: int = 8) -> dict[str, Any]:
    """Every node asks for every cell's own model once (one token): which of them are served,
    and by a node of the right cell (its name's index modulo ``cells``)."""
    jobs = [(name, k) for name in sorted(socks) for k in range(cells)]
    results: list[tuple[str, int, Any]] = []
    limit = trio.CapacityLimiter(concurrency)

    async def one(i: int, name: str, k: int) -> None:
        async with limit:
            fields = {**request_fields("reach", i, 1), "model": f"cell-r{k}"}
            results.append((name, k, await attempt(socks[name], fields, name)))

    async with trio.open_nursery() as nursery:
        for i, (name, k) in enumerate(jobs):
            nursery.start_soon(one, i, name, k)
    ok = [(n, k, a) for n, k, a in results if not a.error and a.tokens >= 1]
    right_cell = [1 for _, k, a in ok if a.served and int(a.served[-1][1:]) % cells == k]
    return {"asked": len(jobs), "served": len(ok), "served_in_its_cell": len(right_cell),
            "errors": sorted({f"{n} -> cell-r{k}: {a.error[:80]}" for n, k, a in results if a.error})[:8]}


async def load_run(socks: dict[str, str], rate: float, duration_s: float, seed: int,
                   max_tokens: int, tag: str) -> dict[str, Any]:
    plan = arrivals(rate, None, duration_s, sorted(socks), seed)
    results = []
    t0 = trio.current_time()

    async def one(i: int, at: float, entry: str) -> None:
        await trio.sleep_until(t0 + at)
        results.append(await attempt(socks[entry], request_fields(tag, i, max_tokens), entry))

    async with trio.open_nursery() as nursery:
        for i, (at, entry) in enumerate(plan):
            nursery.start_soon(one, i, at, entry)
    ttft = [a.ttft_ms for a in results if a.ttft_ms is not None and not a.error]
    served_outside = sum(1 for a in results if a.served and a.served[-1] != a.entry)
    return {"requests": len(plan), "completed": len(ttft), "failed": len(plan) - len(ttft),
            "ttft_p50_ms": percentile(ttft, 50), "ttft_p95_ms": percentile(ttft, 95),
            "ttft_p99_ms": percentile(ttft, 99), "forwarded": served_outside,
            "errors": sorted({a.error[:80] for a in results if a.error})[:5]}


def run_mode(mode: str, args: argparse.Namespace) -> dict[str, Any]:
    d = Path(tempfile.mkdtemp(prefix=f"bench-cells-{mode}-"))
    specs = specs_for(args.nodes, args.cells, mode, args)
    log(f"{mode}: starting {args.nodes} daemons in {d}")
    t_start = time.monotonic()
    index = up(d, specs, advert_interval_s=args.advert_interval_s, wait=False, start_gap_s=args.start_gap_s)
    socks = {n["name"]: n["socket"] for n in index["nodes"]}
    pids = {n["name"]: n["pid"] for n in index["nodes"]}
    out: dict[str, Any] = {"mode": mode, "dir": str(d)}
    try:
        async def wait_formed() -> tuple[float, float]:
            deadline = trio.current_time() + args.form_timeout_s
            while True:
                share = await coverage(socks, mode, args.nodes, args.cells)
                if share >= args.form_share or trio.current_time() > deadline:
                    return time.monotonic() - t_start, share
                await trio.sleep(2.0)

        out["formed_s"], out["coverage_at_start"] = trio.run(wait_formed)

        async def wait_started() -> int:
            # --form-share below 1 can end the wait before the last daemons (started
            # --start-gap-s apart) are up; the reach check would then count them as failures
            deadline = trio.current_time() + 120.0
            while True:
                sts = await ask_all(socks, MessageType.STATUS_REQ, 5.0)
                up_now = sum(1 for v in sts.values() if v is not None)
                if up_now == len(socks) or trio.current_time() > deadline:
                    return up_now
                await trio.sleep(1.0)

        out["daemons_answering"] = trio.run(wait_started)
        log(f"{mode}: {out['coverage_at_start']:.0%} formed after {out['formed_s']:.0f} s; "
            f"settling {args.settle_s:.0f} s")
        if args.reach:
            out["reach"] = trio.run(reach, socks, args.cells)
            log(f"{mode}: reach {json.dumps(out['reach'])}")
        time.sleep(args.settle_s)
        a = trio.run(counters, socks, pids)
        time.sleep(args.idle_s)
        b = trio.run(counters, socks, pids)
        out["idle"] = rates(a, b)
        out["idle"]["loadavg_1min_at_end"] = os.getloadavg()[0]
        out["coverage_after_idle"] = trio.run(coverage, socks, mode, args.nodes, args.cells)
        log(f"{mode}: idle {json.dumps(out['idle'])}")
        cap = capacity_rps(args.nodes, args.cap, args.max_tokens)
        rate = args.load * cap
        out["capacity_rps"], out["rate_rps"] = cap, rate
        a = trio.run(counters, socks, pids)
        out["load"] = trio.run(load_run, socks, rate, args.duration_s, args.seed, args.max_tokens, mode)
        b = trio.run(counters, socks, pids)
        out["load_traffic"] = rates(a, b)
        out["load_traffic"]["loadavg_1min_at_end"] = os.getloadavg()[0]
        log(f"{mode}: load {json.dumps(out['load'])} traffic {json.dumps(out['load_traffic'])}")
    finally:
        down(d)
    return out


def _ms(v: Any) -> str:
    return "" if v is None else f"{v:,.0f}"


def report(args: argparse.Namespace, runs: dict[str, dict[str, Any]]) -> str:
    lines = [f"# bench_cells: {args.nodes} daemons, {args.cells} regions, advert every "
             f"{args.advert_interval_s:g} s, load {args.load:g} x capacity, {machine_note()}", ""]
    hdr = ("| mode | phase | gossip+probe bytes/s per node (median) | mean | CPU % per daemon (median) "
           "| mean | TTFT p50 ms | p95 | p99 | completed | failed | load average (1 min) at the end |")
    lines += [hdr, "|" + "---|" * 12]
    for mode, r in runs.items():
        for phase, key in (("idle", "idle"), ("70% load" if args.load == 0.7 else "load", "load_traffic")):
            t = r.get(key) or {}
            ld = r.get("load", {}) if key == "load_traffic" else {}
            lines.append(f"| {mode} ({r.get('coverage_after_idle', 0):.0%} known) | {phase} | {t.get('bytes_per_node_s_median', 0):,.0f} | "
                         f"{t.get('bytes_per_node_s_mean', 0):,.0f} | {t.get('cpu_pct_median', 0):.1f} | "
                         f"{t.get('cpu_pct_mean', 0):.1f} | {_ms(ld.get('ttft_p50_ms'))} | "
                         f"{_ms(ld.get('ttft_p95_ms'))} | {_ms(ld.get('ttft_p99_ms'))} | "
                         f"{ld.get('completed', '')} | {ld.get('failed', '')} | "
                         f"{t.get('loadavg_1min_at_end', 0):.1f} |")
    for mode, r in runs.items():
        if "reach" in r:
            q = r["reach"]
            lines.append(f"\n{mode}: every node asked for every cell's model: {q['served']} of "
                         f"{q['asked']} served, {q['served_in_its_cell']} by a node of that cell")
    if "flat" in runs and "cells" in runs:
        f, c = runs["flat"], runs["cells"]
        for key in ("idle", "load_traffic"):
            fb, cb = f[key]["bytes_per_node_s_median"], c[key]["bytes_per_node_s_median"]
            fc, cc = f[key]["cpu_pct_median"], c[key]["cpu_pct_median"]
            lines.append(f"\n{key}: cells/flat gossip bytes {cb / fb:.2f}x (goal <= 0.4x), "
                         f"CPU {cc / fc:.2f}x (goal <= 0.4x)")
        fp, cp = f["load"]["ttft_p95_ms"], c["load"]["ttft_p95_ms"]
        lines.append(f"TTFT p95 cells/flat {cp / fp:.2f}x (goal <= 1.2x)")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=40)
    ap.add_argument("--cells", type=int, default=4)
    ap.add_argument("--modes", default="flat,cells")
    ap.add_argument("--idle-s", type=float, default=60.0)
    ap.add_argument("--settle-s", type=float, default=20.0)
    ap.add_argument("--load", type=float, default=0.7)
    ap.add_argument("--duration-s", type=float, default=60.0)
    ap.add_argument("--max-tokens", type=int, default=4)
    ap.add_argument("--cap", type=float, default=2.0, help="decode tokens/s per request of every node")
    ap.add_argument("--advert-interval-s", type=float, default=5.0)
    ap.add_argument("--summary-interval-s", type=float, default=0.0,
                    help="cells mode: summary interval (0: the daemon's default)")
    ap.add_argument("--reach", action="store_true",
                    help="each cell also serves a model of its own (cell-rK); once formed, every "
                         "node asks for every cell's model (reported as 'reach')")
    ap.add_argument("--start-gap-s", type=float, default=0.0,
                    help="seconds between daemon starts (0: all at once)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--ping-interval-s", type=float, default=10.0)
    ap.add_argument("--stall-timeout-s", type=float, default=3.0)
    ap.add_argument("--form-share", type=float, default=1.0,
                    help="start measuring once the nodes know this share of the mesh (mean)")
    ap.add_argument("--form-timeout-s", type=float, default=FORM_TIMEOUT_S,
                    help="... or after this long, whatever they know (reported)")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    runs = {}
    for mode in args.modes.split(","):
        runs[mode] = run_mode(mode, args)
    text = report(args, runs)
    print(f"commit {commit}\n{text}")
    if args.out:
        Path(args.out).write_text(json.dumps({"args": vars(args), "commit": commit, "runs": runs,
                                              "machine": machine_note()}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
