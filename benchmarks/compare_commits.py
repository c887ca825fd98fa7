"""Run one benchmark on two commits, side by side in one script, and print the medians.

Each commit is checked out into a temporary git worktree; the benchmark runs alternately on
the two (A B A B ...), each run with that tree first on PYTHONPATH (the daemons a benchmark
starts inherit it), and writes its figures with ``--out FILE.json``. Every number the two JSON
files share is printed with its median over the rounds and the ratio head/base, so a refactor
can be shown to change nothing beyond noise (issue 12's acceptance), on the same box, in the
same minutes.

    .venv/bin/python benchmarks/compare_commits.py --base 9fbf294 --head HEAD --rounds 3 \\
        -- benchmarks/bench_router.py --n 1000 --decisions 2000 --daemon
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def flatten(obj: Any, prefix: str = "") -> dict[str, float]:
    """Every number in a JSON document, keyed by its path; list items that carry identifying
    fields (nodes, case, strategy, streams, path) are keyed by those instead of their index."""
    out: dict[str, float] = {}
    if isinstance(obj, bool):
        return out
    if isinstance(obj, int | float):
        out[prefix] = float(obj)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            if k in ("meta", "when", "commit", "host", "wall_s", "cpu_s"):
                continue
            out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            tag = str(i)
            if isinstance(v, dict):
                ids = [f"{k}={v[k]}" for k in ("nodes", "case", "strategy", "rates", "streams", "path", "n")
                       if k in v and not isinstance(v[k], float)]
                tag = ",".join(ids) or tag
                v = {k: x for k, x in v.items() if k not in ("nodes", "case", "strategy", "rates",
                                                             "streams", "path", "n")}
            out.update(flatten(v, f"{prefix}[{tag}]"))
    return out


def worktree(rev: str, where: Path) -> Path:
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-f", str(where), rev],
                   check=True, capture_output=True)
    return where


def run(tree: Path, bench: list[str], out: Path) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cmd = [sys.executable, str(tree / bench[0]), *bench[1:], "--out", str(out)]
    subprocess.run(cmd, cwd=tree, env=env, check=True, stdout=subprocess.DEVNULL)
    return flatten(json.loads(out.read_text()))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, help="the commit to compare against")
    ap.add_argument("--head", default="HEAD")
    ap.add_argument("--rounds", type=int, default=3, help="runs per commit, alternating")
    ap.add_argument("--match", default="", help="print only figures whose path contains this")
    ap.add_argument("bench", nargs=argparse.REMAINDER, help="-- benchmarks/SCRIPT.py [args]")
    args = ap.parse_args(argv)
    bench = [a for a in args.bench if a != "--"]
    if not bench:
        ap.error("give the benchmark after --")
    with tempfile.TemporaryDirectory(prefix="meshd-compare-") as tmp:
        t = Path(tmp)
        trees = {"base": worktree(args.base, t / "base"), "head": worktree(args.head, t / "head")}
        figures: dict[str, list[dict[str, float]]] = {"base": [], "head": []}
        try:
            for r in range(args.rounds):
                for side in ("base", "head"):
                    print(f"round {r + 1}/{args.rounds}: {side}", file=sys.stderr, flush=True)
                    figures[side].append(run(trees[side], bench, t / f"{side}-{r}.json"))
        finally:
            for tree in trees.values():
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                               capture_output=True)
    keys = sorted(set.intersection(*(set(f) for f in figures["base"] + figures["head"])))
    print(f"{'figure':<60} {'base':>12} {'head':>12} {'head/base':>10}")
    for k in keys:
        if args.match not in k:
            continue
        b = statistics.median(f[k] for f in figures["base"])
        h = statistics.median(f[k] for f in figures["head"])
        ratio = f"{h / b:.2f}" if b else "-"
        print(f"{k:<60} {b:>12.4g} {h:>12.4g} {ratio:>10}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
