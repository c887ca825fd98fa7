"""Prefix-aware routing in the simulator (issue 32; docs/benchmarks.md, docs/sim.md).

    PYTHONPATH=. .venv/bin/python benchmarks/bench_chat_prefix.py [--seeds 1,2,3] [--jobs 2]
        [--duration S] [--out benchmarks/results-chat-prefix.json]

On ``testnet/scenarios/chat-512.toml`` (512 nodes, the multi-turn chat workload at 70% load,
every node with a KV prefix cache) and its variants with 0% and 90% of the conversations
opening with a shared system prompt (``-share-0``, ``-share-90``): TTFT p50/p95/p99 of

- ``meshd`` (the prefill credit for a cached prefix in the prediction),
- ``meshd_no_prefix`` (the same nodes and caches, the credit left out: routing blind to them),
- ``prefix_only`` (the longest advertised prefix, ties to the least loaded: llm-d's precise
  prefix scorer alone),
- ``meshd`` on ``-nocache`` (no prefix cache anywhere: meshd before issue 32),

per seed, and their means over the seeds; with the ratios the issue's goals are stated in. The
simulator is deterministic: the same command gives the same figures on any machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from meshd.sim.runner import run_one
from meshd.sim.scenario_parse import load_scenario

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ROOT / "testnet" / "scenarios"
SHARES = {"0": "chat-512-share-0.toml", "50": "chat-512.toml", "90": "chat-512-share-90.toml"}
ROWS = (("meshd", ""), ("meshd_no_prefix", ""), ("prefix_only", ""), ("meshd", "-nocache"))
KEYS = ("ttft_p50_ms", "ttft_p95_ms", "ttft_p99_ms", "completed", "failed", "prefix_hits",
        "prefix_reused_tokens")


def _run(job: tuple[str, str, int, float | None]) -> tuple[tuple[str, str, int], dict[str, Any]]:
    file, strategy, seed, duration = job
    sc = load_scenario(SCENARIOS / file).with_overrides(duration_s=duration, seed=seed)
    r = run_one(sc, strategy, seed)
    return (file, strategy, seed), {k: r.get(k) for k in KEYS}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--shares", default="0,50,90", help="of " + ",".join(SHARES))
    ap.add_argument("--duration", type=float, help="simulated seconds (default: the scenario's)")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--rows", default=",".join(s + v for s, v in ROWS),
                    help="rows to run (default all)")
    ap.add_argument("--merge", type=Path,
                    help="an earlier --out file: its rows, with these run again replacing theirs")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    wanted = set(args.rows.split(","))
    rows_run = tuple(r for r in ROWS if r[0] + r[1] in wanted)
    seeds = [int(s) for s in args.seeds.split(",")]
    shares = args.shares.split(",")
    jobs = []
    for share in shares:
        base = SHARES[share]
        for strategy, variant in rows_run:
            if variant and share != "50":
                continue  # no cache: one share is enough (nothing is reused at any)
            file = base.replace(".toml", f"{variant}.toml") if variant else base
            jobs += [(file, strategy, seed, args.duration) for seed in seeds]
    with ProcessPoolExecutor(max_workers=max(args.jobs, 1)) as pool:
        runs = dict(pool.map(_run, jobs))
    old = json.loads(args.merge.read_text()) if args.merge else {"shares": {}}
    out: dict[str, Any] = {"seeds": seeds, "duration_s": args.duration, "shares": {}}
    for share in shares:
        rows: dict[str, Any] = dict(old["shares"].get(share, {}).get("rows", {}))
        for strategy, variant in rows_run:
            if variant and share != "50":
                continue
            file = SHARES[share].replace(".toml", f"{variant}.toml") if variant else SHARES[share]
            per = [runs[(file, strategy, s)] for s in seeds]
            mean = {k: statistics.fmean(float(p[k] or 0) for p in per) for k in KEYS}
            rows[strategy + variant] = {"mean": mean, "per_seed": per}
        m = {k: v["mean"] for k, v in rows.items()}
        ratios = {
            f"meshd/{b} {q}": m["meshd"][f"ttft_{q}_ms"] / m[b][f"ttft_{q}_ms"]
            for b in m if b != "meshd" and "meshd" in m for q in ("p50", "p95")
        }
        out["shares"][share] = {"rows": rows, "ratios": ratios}
        print(f"share {share}%")
        for name, r in m.items():
            print(f"  {name:18s} p50 {r['ttft_p50_ms']:8.1f}  p95 {r['ttft_p95_ms']:8.1f}  "
                  f"p99 {r['ttft_p99_ms']:8.1f}  failed {r['failed']:6.1f}  "
                  f"tokens reused {r['prefix_reused_tokens'] / 1000:8.0f}k")
        for k, v in ratios.items():
            print(f"  {k}: {v:.3f}")
    if args.out:
        args.out.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
