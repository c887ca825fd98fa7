"""Membership figures of real daemons on loopback (issue 2): advert propagation, join time, idle cost.

Three measurements, each on real ``meshd run`` processes started by the testnet launcher with
fresh keys and no model loaded (the figures are about the mesh, not inference):

* ``propagation``: N daemons (default 20) at the default advert interval for a window of W
  seconds. Every daemon records, for each advert it accepts from gossip, the delay from the
  author's timestamp (taken just before signing and publishing) to acceptance; on one machine
  the clocks agree, so this is publish-to-receipt. Pooled p50/p99 over every (advert, receiver)
  pair, and the CPU every daemon used in the window (% of one core, from /proc).
* ``join``: with N-1 daemons up, start one more ``meshd run`` and time (a) process start to its
  control socket answering, (b) to its peer table listing all N-1 others, (c) to every other
  daemon listing it. Repeated J times (the joiner stops, the others drop it, it starts again).
* ``idle``: P+1 daemons (default 11: each has 10 peers) idle for W seconds: RSS and CPU of each.

    .venv/bin/python benchmarks/bench_mesh.py [--nodes 20] [--window 60] [--joins 5]
                                              [--idle-nodes 11] [--only propagation,join,idle]
                                              [--set gossip.ping_interval_s=2] [--out FILE.json]

``--set SECTION.KEY=VALUE`` (repeatable) overrides a config key on every daemon, to compare a
setting against the defaults. Each part prints the load average of the machine before and after
it: the box is shared, and the figures only mean something next to it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# the daemons this benchmark starts answer from a model, never from the semantic cache
os.environ.setdefault("MESHD_TESTNET_CACHE", "0")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import trio  # noqa: E402

from meshd.config import GossipConfig  # noqa: E402
from meshd.control.client import call  # noqa: E402
from meshd.core.messages import MessageType  # noqa: E402
from meshd.errors import MeshdError  # noqa: E402
from meshd.testnet import children, launcher  # noqa: E402

CLK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
EXTRA: dict[str, dict[str, Any]] = {}  # --set overrides, applied to every daemon's config


def load_avg() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f}, {five:.2f}, {fifteen:.2f}"


def parse_set(items: list[str]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        section, dot, name = key.partition(".")
        if not sep or not dot:
            raise SystemExit(f"--set wants SECTION.KEY=VALUE, not {item!r}")
        try:
            value = json.loads(raw)
        except ValueError:
            value = raw
        out.setdefault(section, {})[name] = value
    return out


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        parts = f.read().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / CLK  # utime + stime


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * PAGE / 2**20


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


async def ask(sock: str, mtype: MessageType) -> Any:
    with trio.fail_after(5):
        return await call(sock, mtype, {})


async def peers_of(sock: str) -> list[dict[str, Any]] | None:
    try:
        return list((await ask(sock, MessageType.PEERS_REQ))["peers"])
    except (MeshdError, OSError, trio.TooSlowError):
        return None


def specs(n: int, prefix: str = "n") -> list[launcher.NodeSpec]:
    return [launcher.NodeSpec(name=f"{prefix}{i + 1}", models=[], extra=dict(EXTRA)) for i in range(n)]


def start(directory: Path, n: int, interval: float) -> dict[str, Any]:
    t0 = time.perf_counter()
    index = launcher.up(directory, specs(n), advert_interval_s=interval)
    print(f"  {n} daemons up and fully meshed in {time.perf_counter() - t0:.1f} s "
          f"(all started at once on {os.cpu_count()} cores)", flush=True)
    return index


def window_cpu(pids: list[int], seconds: float) -> list[float]:
    before = [cpu_seconds(p) for p in pids]
    t0 = time.perf_counter()
    time.sleep(seconds)
    wall = time.perf_counter() - t0
    return [100.0 * (cpu_seconds(p) - b) / wall for p, b in zip(pids, before, strict=True)]


def propagation(base: Path, n: int, window: float, interval: float) -> dict[str, Any]:
    print(f"propagation: {n} daemons, advert interval {interval} s, window {window:.0f} s", flush=True)
    d = base / "prop"
    index = start(d, n, interval)
    try:
        pids = [node["pid"] for node in index["nodes"]]
        time.sleep(interval)  # let the start-up burst (joins, early adverts) pass
        # restart the delay samples' window: count only adverts heard from here on
        before = trio.run(_delay_counts, index)
        cpu = window_cpu(pids, window)
        after = trio.run(_delays, index, before)
    finally:
        launcher.down(d)
    delays = [x for xs in after.values() for x in xs]
    res = {
        "nodes": n,
        "advert_interval_s": interval,
        "window_s": window,
        "samples": len(delays),
        "delay_p50_ms": round(pct(delays, 0.50), 1) if delays else None,
        "delay_p99_ms": round(pct(delays, 0.99), 1) if delays else None,
        "delay_max_ms": round(max(delays), 1) if delays else None,
        "cpu_pct_per_daemon_median": round(statistics.median(cpu), 2),
        "cpu_pct_per_daemon_max": round(max(cpu), 2),
        "cpu_pct_all_daemons": round(sum(cpu), 1),
        "machine_cores": os.cpu_count(),
    }
    print(f"  samples {res['samples']}  p50 {res['delay_p50_ms']} ms  p99 {res['delay_p99_ms']} ms  "
          f"max {res['delay_max_ms']} ms", flush=True)
    print(f"  CPU per daemon: median {res['cpu_pct_per_daemon_median']}% max "
          f"{res['cpu_pct_per_daemon_max']}% of one core; all {n}: {res['cpu_pct_all_daemons']}% "
          f"of one core ({res['cpu_pct_all_daemons'] / os.cpu_count():.1f}% of the machine)", flush=True)
    return res


async def _status(sock: str) -> dict[str, Any]:
    return dict((await ask(sock, MessageType.STATUS_REQ))["data"])


async def _delay_counts(index: dict[str, Any]) -> dict[str, int]:
    out = {}
    for node in index["nodes"]:
        st = await _status(node["socket"])
        out[node["name"]] = int(st["services"]["advert_delay_ms"]["n"])
    return out


async def _delays(index: dict[str, Any], before: dict[str, int]) -> dict[str, list[float]]:
    out = {}
    for node in index["nodes"]:
        st = await _status(node["socket"])
        d = st["services"]["advert_delay_ms"]
        recent = list(d["recent"])
        new = int(d["n"]) - before[node["name"]]  # samples taken in the window (the ring may hold fewer)
        out[node["name"]] = recent[len(recent) - max(0, min(new, len(recent))):]
    return out


def join(base: Path, n: int, joins: int, interval: float) -> dict[str, Any]:
    print(f"join: a daemon joins a mesh of {n - 1}, {joins} times", flush=True)
    d = base / "join"
    all_specs = specs(n)
    joiner = all_specs[-1]
    index = launcher.up(d, all_specs[:-1], advert_interval_s=interval)
    # keys and config for the joiner, from the same CA, bootstrapping from node 1
    try:
        _issue_one(d, joiner)
        joiner.port = launcher.free_port()
        boot = [index["nodes"][0]["addr"]]
        jdir = d / joiner.name
        cfg = launcher.node_config(joiner, jdir, boot, advert_interval_s=interval)
        (jdir / "meshd.toml").write_text(launcher.write_toml(cfg))
        others = [node["socket"] for node in index["nodes"]]
        rows = []
        for _ in range(joins):
            t0 = time.perf_counter()
            pid = launcher.start_process(jdir)
            r = trio.run(_watch_join, str(jdir / "meshd.sock"), others, n - 1, t0, pid)
            rows.append(r)
            print(f"  socket {r['socket_s']:.2f} s  sees all {n - 1} {r['sees_all_s']:.2f} s  "
                  f"seen by all {r['seen_by_all_s']:.2f} s", flush=True)
            os.kill(pid, signal.SIGTERM)
            children.reap(pid)
            trio.run(_wait_gone, others, joiner.name)
    finally:
        launcher.down(d)
    res = {
        "mesh_nodes": n,
        "joins": joins,
        "socket_s_median": round(statistics.median(r["socket_s"] for r in rows), 2),
        "sees_all_s_median": round(statistics.median(r["sees_all_s"] for r in rows), 2),
        "sees_all_s_max": round(max(r["sees_all_s"] for r in rows), 2),
        "seen_by_all_s_median": round(statistics.median(r["seen_by_all_s"] for r in rows), 2),
        "rows": rows,
    }
    print(f"  median: control socket {res['socket_s_median']} s, sees every peer "
          f"{res['sees_all_s_median']} s (max {res['sees_all_s_max']} s), seen by every peer "
          f"{res['seen_by_all_s_median']} s", flush=True)
    return res


def _issue_one(directory: Path, spec: launcher.NodeSpec) -> None:
    import contextlib
    import io

    from meshd.cli.main import main

    with contextlib.redirect_stdout(io.StringIO()):
        rc = main(["keys", "issue", spec.name, "--dir", str(directory / "ca"), "--out",
                   str(directory / spec.name), "--days", "30", "--label", f"region={spec.region}"])
    if rc != 0:
        raise SystemExit(f"cannot issue keys for {spec.name}")


async def _watch_join(sock: str, others: list[str], expect: int, t0: float, pid: int) -> dict[str, float]:
    socket_s = sees_all_s = seen_by_all_s = None
    deadline = trio.current_time() + 60
    while sees_all_s is None or seen_by_all_s is None:
        if trio.current_time() > deadline:
            raise SystemExit("joiner did not converge within 60 s")
        if not children.alive(pid):
            raise SystemExit("the joining daemon exited")
        mine = await peers_of(sock)
        now = time.perf_counter() - t0
        if mine is not None and socket_s is None:
            socket_s = now
        if mine is not None and sees_all_s is None and len(mine) >= expect:
            sees_all_s = now
        if seen_by_all_s is None and socket_s is not None:
            counts = [await peers_of(o) for o in others]
            if all(c is not None and len(c) >= expect for c in counts):
                seen_by_all_s = time.perf_counter() - t0
        await trio.sleep(0.02)
    return {"socket_s": socket_s, "sees_all_s": sees_all_s, "seen_by_all_s": seen_by_all_s}


async def _wait_gone(others: list[str], name: str) -> None:
    with trio.fail_after(30):
        while True:
            lists = [await peers_of(o) for o in others]
            if all(ps is not None and all(p["name"] != name for p in ps) for ps in lists):
                return
            await trio.sleep(0.1)


def idle(base: Path, n: int, window: float, interval: float) -> dict[str, Any]:
    print(f"idle: {n} daemons (each with {n - 1} peers), no model, window {window:.0f} s", flush=True)
    d = base / "idle"
    index = start(d, n, interval)
    try:
        pids = [node["pid"] for node in index["nodes"]]
        time.sleep(interval)
        cpu = window_cpu(pids, window)
        rss = [rss_mb(p) for p in pids]
    finally:
        launcher.down(d)
    res = {
        "nodes": n,
        "peers_each": n - 1,
        "window_s": window,
        "rss_mb_median": round(statistics.median(rss), 1),
        "rss_mb_max": round(max(rss), 1),
        "cpu_pct_median": round(statistics.median(cpu), 2),
        "cpu_pct_max": round(max(cpu), 2),
    }
    print(f"  RSS median {res['rss_mb_median']} MB (max {res['rss_mb_max']} MB); CPU median "
          f"{res['cpu_pct_median']}% (max {res['cpu_pct_max']}%) of one core", flush=True)
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=20)
    ap.add_argument("--window", type=float, default=60.0)
    ap.add_argument("--joins", type=int, default=5)
    ap.add_argument("--idle-nodes", type=int, default=11)
    ap.add_argument("--interval", type=float, default=GossipConfig.advert_interval_s,
                    help="advert interval (default: the daemon's default)")
    ap.add_argument("--only", default="propagation,join,idle")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                    help="override a config key on every daemon (repeatable)")
    ap.add_argument("--out")
    args = ap.parse_args()
    EXTRA.update(parse_set(args.set))
    print(f"# {' '.join([Path(sys.executable).name, *sys.argv])}")
    print(f"# python {platform.python_version()}, {os.cpu_count()} cores, {platform.machine()}")
    base = Path(tempfile.mkdtemp(prefix="meshd-bench-mesh-"))
    results: dict[str, Any] = {"overrides": EXTRA}
    try:
        parts = args.only.split(",")
        for part, run in (
            ("propagation", lambda: propagation(base, args.nodes, args.window, args.interval)),
            ("join", lambda: join(base, args.nodes, args.joins, args.interval)),
            ("idle", lambda: idle(base, args.idle_nodes, args.window, args.interval)),
        ):
            if part not in parts:
                continue
            before = os.getloadavg()
            print(f"  ({load_avg()} before {part})", flush=True)
            results[part] = run()
            results[part]["load_avg_before"] = [round(x, 2) for x in before]
            results[part]["load_avg_after"] = [round(x, 2) for x in os.getloadavg()]
            print(f"  ({load_avg()} after {part})", flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
