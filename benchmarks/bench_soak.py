"""Issue 13's soak: a testnet of real daemons under steady load for a long time, watching every
daemon's memory and open file descriptors.

    .venv/bin/python benchmarks/bench_soak.py [--nodes 5] [--duration 600] [--load 0.6]
        [--cap 10] [--max-tokens 16] [--sample-every 10] [--seed 1]
        [--out soak.json] [--plot docs/img/soak.png] [--memtrace DIR] [--census DIR]

It starts ``--nodes`` daemons on loopback (``meshd.testnet.launcher``, the shipped model, each
node capped at ``--cap`` decode tokens/s with 2 slots, so the mesh's capacity is
``nodes x 2 / ((max_tokens - 1) / cap)`` requests/s whatever else the machine runs), and offers
open-loop Poisson arrivals at ``--load`` x that capacity for ``--duration`` seconds, each at a
uniformly chosen entry node. Every ``--sample-every`` seconds it reads each daemon's RSS and
open file descriptors from /proc, and sorts the descriptors: a control-socket connection accepted
from a client is that client's request in flight (closed when it is answered, so their number
follows the Poisson arrivals: 0 to 8 at one instant at 60% load); the rest ("held") are what the
daemon keeps (files, listeners, one connection per peer, trio's and SQLite's). Goals (issue 13):
no daemon's RSS or held descriptors grow beyond its first minute's level + 10% (the first
minute's level: the largest sample taken in the first 60 s), and zero failed requests; the total
with the clients' connections is reported beside it. Prints one summary, writes every sample as
JSON and plots them.

``--memtrace DIR`` (for hunting growth, not for the figures: tracemalloc costs memory and CPU)
starts every daemon with tracemalloc (benchmarks/memtrace/sitecustomize.py), snapshots each one
at the end of the first minute and at the end of the run, and prints the source lines whose
live memory grew most in between, summed over the daemons.

``--census DIR`` (cheap enough for runs of an hour: no allocation hook) has every daemon write,
each ``--census-every`` seconds, its RSS, glibc's heap in use, SQLite's heap, pymalloc's blocks,
its live objects per type and its largest containers with their owners (Class.attribute); the
summary prints what grew between the first minute and the end. A structure that keeps growing
shows by its length; a cache shows by stopping at its bound.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio
from loadgen import (
    ROOT,
    Attempt,
    arrivals,
    attempt,
    capacity_rps,
    capped_specs,
    fd_census,
    log,
    machine_note,
    percentile,
    request_fields,
    rss_kb,
    unix_socket_paths,
)

from meshd.testnet.launcher import down, up

# the daemons this benchmark starts answer from a model, never from the semantic cache
os.environ.setdefault("MESHD_TESTNET_CACHE", "0")

GROWTH_LIMIT = 1.10
FIRST_MINUTE_S = 60.0


async def sample(pids: dict[str, int], socks: dict[str, str], in_flight: dict[str, int],
                 every_s: float, t0: float, out: list[dict[str, Any]], stop: trio.Event) -> None:
    """Every ``every_s``: each daemon's RSS, its open file descriptors, how many of those are
    control-socket connections accepted from clients, and how many requests this benchmark
    has in flight at that entry node (the cross-check: the two move together)."""
    while not stop.is_set():
        t = trio.current_time() - t0
        unix = unix_socket_paths()
        census = {n: fd_census(p, socks[n], unix) for n, p in pids.items()}
        out.append({"t_s": round(t, 1),
                    "rss_kb": {n: rss_kb(p) for n, p in pids.items()},
                    "fds": {n: c[0] if c else None for n, c in census.items()},
                    "client_fds": {n: c[1] if c else None for n, c in census.items()},
                    "fds_held": {n: c[0] - c[1] if c else None for n, c in census.items()},
                    "in_flight": dict(in_flight)})
        with trio.move_on_after(every_s - (trio.current_time() - t0 - t)):
            await stop.wait()


def snapshot_all(pids: dict[str, int]) -> None:
    """Ask every daemon started under --memtrace to write a tracemalloc snapshot (SIGUSR1)."""
    for pid in pids.values():
        try:
            os.kill(pid, signal.SIGUSR1)
        except ProcessLookupError:
            pass


async def census_loop(pids: dict[str, int], every_s: float, stop: trio.Event) -> None:
    """--census: every ``every_s`` (from t=0), ask each daemon for its object census (SIGUSR2)."""
    while not stop.is_set():
        for pid in pids.values():
            try:
                os.kill(pid, signal.SIGUSR2)
            except ProcessLookupError:
                pass
        with trio.move_on_after(every_s):
            await stop.wait()


def census_report(directory: Path, pids: dict[str, int]) -> list[str]:
    """Each daemon's census at the end of the first minute against its last: RSS, glibc's heap in
    use, pymalloc's blocks, gc objects, the types and the containers that grew most."""
    lines = ["census (first minute -> end): RSS MiB, glibc heap in use MiB (of which SQLite's), "
             "pymalloc blocks, gc objects; types and containers that grew"]
    for name, pid in pids.items():
        path = directory / f"{pid}-census.jsonl"
        if not path.exists():
            continue
        recs = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
        t0 = recs[0]["t"]
        first = next((r for r in recs if r["t"] - t0 >= FIRST_MINUTE_S - 5), recs[0])
        if first is recs[-1]:
            first = recs[0]
        last = recs[-1]
        lines.append(
            f"{name}: RSS {first['rss_kb'] / 1024:.1f} -> {last['rss_kb'] / 1024:.1f}; heap "
            f"{first.get('heap_in_use', 0) / 2**20:.1f} -> {last.get('heap_in_use', 0) / 2**20:.1f} "
            f"({first.get('sqlite_memory', 0) / 2**20:.1f} -> {last.get('sqlite_memory', 0) / 2**20:.1f}); "
            f"blocks {first['pymalloc_blocks']} -> {last['pymalloc_blocks']}; objects "
            f"{first['gc_objects']} -> {last['gc_objects']} ({len(recs)} censuses)")
        grew = sorted(((last["types"].get(k, 0) - first["types"].get(k, 0), k)
                       for k in last["types"]), reverse=True)[:5]
        lines.append("    types: " + ", ".join(f"{k} +{d}" for d, k in grew if d > 0))
        fa, la = first.get("attrs", {}), last.get("attrs", {})
        up = sorted(((n - fa.get(k, 0), k) for k, n in la.items()), reverse=True)[:6]
        lines.append("    attributes: " + ", ".join(f"{k} {fa.get(k, 0)}->{la[k]}" for d, k in up if d > 0))
        before = {c["owner"]: c["len"] for c in first["largest"]}
        lines.append("    largest: " + ", ".join(
            f"{c['owner']} {before.get(c['owner'], '?')}->{c['len']}" for c in last["largest"][:8]))
    return lines


async def memtrace_first_minute(pids: dict[str, int], t0: float) -> None:
    await trio.sleep_until(t0 + FIRST_MINUTE_S)
    snapshot_all(pids)


def memtrace_report(directory: Path, pids: dict[str, int], top: int = 15) -> list[str]:
    """The source lines whose traced memory grew most between each daemon's first and last
    snapshot, summed over the daemons."""
    import tracemalloc

    growth: dict[str, list[int]] = {}
    for pid in pids.values():
        snaps = sorted(directory.glob(f"{pid}-*.snap"))
        if len(snaps) < 2:
            continue
        first, last = (tracemalloc.Snapshot.load(str(x)) for x in (snaps[0], snaps[-1]))
        for st in last.compare_to(first, "lineno"):
            frame = st.traceback[0]
            key = f"{frame.filename}:{frame.lineno}"
            g = growth.setdefault(key, [0, 0])
            g[0] += st.size_diff
            g[1] += st.count_diff
    rows = sorted(growth.items(), key=lambda kv: -kv[1][0])[:top]
    lines = [f"tracemalloc: growth between the end of the first minute and the end, summed over "
             f"{len(pids)} daemons (KiB, blocks, line):"]
    lines += [f"  {size / 1024:>9.1f} {count:>8}  {key}" for key, (size, count) in rows]
    return lines


async def drive(index: dict[str, Any], args: argparse.Namespace, rate: float) -> dict[str, Any]:
    socks = {n["name"]: n["socket"] for n in index["nodes"]}
    pids = {n["name"]: n["pid"] for n in index["nodes"]}
    plan = arrivals(rate, None, args.duration, sorted(socks), args.seed)
    results: list[Attempt] = [Attempt("")] * len(plan)
    samples: list[dict[str, Any]] = []
    stop = trio.Event()
    in_flight = dict.fromkeys(socks, 0)
    t0 = trio.current_time()

    async def one(i: int, at: float, entry: str) -> None:
        await trio.sleep_until(t0 + at)
        in_flight[entry] += 1
        try:
            results[i] = await attempt(socks[entry], request_fields("soak", i, args.max_tokens), entry)
        finally:
            in_flight[entry] -= 1

    async with trio.open_nursery() as outer:
        outer.start_soon(sample, pids, socks, in_flight, args.sample_every, t0, samples, stop)
        if args.memtrace:
            outer.start_soon(memtrace_first_minute, pids, t0)
        if args.census:
            outer.start_soon(census_loop, pids, args.census_every, stop)
        async with trio.open_nursery() as n:
            for i, (at, entry) in enumerate(plan):
                n.start_soon(one, i, at, entry)
        samples_end = trio.current_time() - t0
        stop.set()
    if args.memtrace:
        snapshot_all(pids)
        await wait_for_snapshots(args.memtrace, pids)
    log(f"{len(plan)} requests in {samples_end:.0f} s")
    return {"results": results, "samples": samples, "wall_s": samples_end}


async def wait_for_snapshots(directory: Path, pids: dict[str, int], timeout_s: float = 120.0) -> None:
    with trio.move_on_after(timeout_s):
        while not all(len(list(directory.glob(f"{pid}-*.snap"))) >= 2 for pid in pids.values()):
            await trio.sleep(0.5)


def growth(samples: list[dict[str, Any]], key: str, name: str) -> dict[str, Any]:
    first = [s[key][name] for s in samples if s["t_s"] <= FIRST_MINUTE_S and s[key][name] is not None]
    later = [s[key][name] for s in samples if s["t_s"] > FIRST_MINUTE_S and s[key][name] is not None]
    base = max(first)
    top = max(later) if later else base
    return {"first_minute": base, "max_after": top, "last": later[-1] if later else base,
            "ratio": round(top / base, 3), "ok": top <= GROWTH_LIMIT * base}


def summarize(run: dict[str, Any], args: argparse.Namespace, rate: float, cap: float) -> dict[str, Any]:
    results: list[Attempt] = run["results"]
    ok = [r for r in results if not r.error]
    names = sorted(run["samples"][0]["rss_kb"])
    per_node = {n: {"rss": growth(run["samples"], "rss_kb", n), "fds": growth(run["samples"], "fds", n),
                    "fds_held": growth(run["samples"], "fds_held", n),
                    "client_fds_max": max((s["client_fds"][n] or 0) for s in run["samples"]),
                    "in_flight_max": max(s["in_flight"][n] for s in run["samples"])}
                for n in names}
    return {
        "command": "benchmarks/bench_soak.py " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
        "when": time.strftime("%Y-%m-%d %H:%M"), "machine": machine_note(),
        "nodes": args.nodes, "duration_s": args.duration, "capacity_rps": round(cap, 3),
        "offered_rps": round(rate, 3), "requests": len(results), "done": len(ok),
        "failed": len(results) - len(ok),
        "errors": sorted({r.error for r in results if r.error})[:10],
        "ttft_ms_p50": round(percentile([r.ttft_ms for r in ok if r.ttft_ms], 50), 1),
        "ttft_ms_p95": round(percentile([r.ttft_ms for r in ok if r.ttft_ms], 95), 1),
        "e2e_ms_p50": round(percentile([r.e2e_ms for r in ok if r.e2e_ms], 50), 1),
        "e2e_ms_p95": round(percentile([r.e2e_ms for r in ok if r.e2e_ms], 95), 1),
        "per_node": per_node,
        # the goal's file descriptors: those the daemon holds, not its clients' connections
        "growth_ok": all(v["rss"]["ok"] and v["fds_held"]["ok"] for v in per_node.values()),
        "samples": run["samples"],
    }


def plot(summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = summary["samples"]
    t = [s["t_s"] / 60.0 for s in samples]
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    for name, v in summary["per_node"].items():
        rss = [(s["rss_kb"][name] or 0) / 1024.0 for s in samples]
        line = ax1.plot(t, rss, label=name)[0]
        ax1.axhline(v["rss"]["first_minute"] / 1024.0 * GROWTH_LIMIT, color=line.get_color(),
                    linestyle=":", linewidth=0.8)
        ax2.plot(t, [s["fds"][name] or 0 for s in samples], color=line.get_color(), alpha=0.35,
                 linewidth=0.8)
        ax2.plot(t, [s["fds_held"][name] or 0 for s in samples], label=name, color=line.get_color())
        ax2.axhline(v["fds_held"]["first_minute"] * GROWTH_LIMIT, color=line.get_color(),
                    linestyle=":", linewidth=0.8)
    for ax in (ax1, ax2):
        ax.axvline(FIRST_MINUTE_S / 60.0, color="grey", linewidth=0.8)
        ax.grid(alpha=0.3)
    ax1.set_ylabel("RSS (MiB)")
    ax2.set_ylabel("open file descriptors\n(faint: with clients' connections)")
    ax2.set_xlabel("minutes")
    ax1.legend(loc="lower right", ncol=len(summary["per_node"]), fontsize=8)
    ax1.set_title(f"soak: {summary['nodes']} daemons, {summary['offered_rps']} req/s "
                  f"({summary['offered_rps'] / summary['capacity_rps']:.0%} of capacity), "
                  f"{summary['done']}/{summary['requests']} done; dotted: first minute + 10%",
                  fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def report(s: dict[str, Any]) -> str:
    lines = [f"# {s['command']}", f"# {s['when']}, {s['machine']}",
             f"offered {s['offered_rps']} req/s = {s['offered_rps'] / s['capacity_rps']:.0%} of "
             f"{s['capacity_rps']} req/s capacity for {s['duration_s']} s: {s['requests']} requests, "
             f"{s['done']} done, {s['failed']} failed; TTFT p50 {s['ttft_ms_p50']} ms p95 "
             f"{s['ttft_ms_p95']} ms; e2e p50 {s['e2e_ms_p50']} ms p95 {s['e2e_ms_p95']} ms",
             "node  RSS first min MiB  max after  last  ratio   held fds first min  max after  "
             "ratio   all fds first min  max after  ratio  client fds max  in flight max"]
    for n, v in s["per_node"].items():
        r, h, f = v["rss"], v["fds_held"], v["fds"]
        lines.append(f"{n:<5} {r['first_minute'] / 1024:>17.1f} {r['max_after'] / 1024:>10.1f} "
                     f"{r['last'] / 1024:>5.1f} {r['ratio']:>6.3f}   {h['first_minute']:>18} "
                     f"{h['max_after']:>10} {h['ratio']:>6.3f}   {f['first_minute']:>17} "
                     f"{f['max_after']:>10} {f['ratio']:>6.3f}  {v['client_fds_max']:>14} "
                     f"{v['in_flight_max']:>13}")
    lines.append(f"growth within first minute + 10% (RSS, held fds): {'yes' if s['growth_ok'] else 'NO'}; "
                 f"failed requests: {s['failed']}")
    if s["errors"]:
        lines.append("errors: " + "; ".join(s["errors"]))
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=5)
    p.add_argument("--duration", type=float, default=600.0)
    p.add_argument("--load", type=float, default=0.6)
    p.add_argument("--cap", type=float, default=10.0, help="decode tokens/s of each node")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--sample-every", type=float, default=10.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", type=Path)
    p.add_argument("--plot", type=Path, default=ROOT / "docs" / "img" / "soak.png")
    p.add_argument("--memtrace", type=Path, metavar="DIR",
                   help="run the daemons under tracemalloc, snapshots in DIR; print the lines that grew")
    p.add_argument("--census", type=Path, metavar="DIR",
                   help="every --census-every s, each daemon writes an object census to DIR "
                        "(benchmarks/memtrace/sitecustomize.py): cheap enough for long runs")
    p.add_argument("--census-every", type=float, default=60.0)
    args = p.parse_args()
    if args.census:
        args.census.mkdir(parents=True, exist_ok=True)
        os.environ["MESHD_MEMTRACE_CENSUS_DIR"] = str(args.census.resolve())
    if args.memtrace:
        args.memtrace.mkdir(parents=True, exist_ok=True)
        os.environ["MESHD_MEMTRACE_DIR"] = str(args.memtrace.resolve())
    if args.memtrace or args.census:
        os.environ["PYTHONPATH"] = os.pathsep.join(
            x for x in (str(ROOT / "benchmarks" / "memtrace"), os.environ.get("PYTHONPATH")) if x)
    cap = capacity_rps(args.nodes, args.cap, args.max_tokens)
    rate = args.load * cap
    with tempfile.TemporaryDirectory(prefix="meshd-soak-") as tmp:
        d = Path(tmp) / "net"
        log(f"starting {args.nodes} daemons")
        index = up(d, capped_specs(args.nodes, args.cap), advert_interval_s=2.0)
        try:
            log(f"offering {rate:.2f} req/s ({args.load:.0%} of {cap:.2f}) for {args.duration:.0f} s")
            run = trio.run(drive, index, args, rate)
        finally:
            down(d)
    summary = summarize(run, args, rate, cap)
    print(report(summary))
    if args.memtrace:
        print("\n".join(memtrace_report(args.memtrace, {n["name"]: n["pid"] for n in index["nodes"]})))
    if args.census:
        print("\n".join(census_report(args.census, {n["name"]: n["pid"] for n in index["nodes"]})))
    if args.out:
        args.out.write_text(json.dumps(summary, indent=1))
    plot(summary, args.plot)
    log(f"plot written to {args.plot}")
    return 0 if summary["growth_ok"] and summary["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
