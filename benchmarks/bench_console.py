"""What one open web console costs (issue 34's figures): the bytes its page transfers at load,
and the CPU of the node serving it, with and without the console open.

A 3-daemon testnet on loopback (each node serving the shipped model, adverts every 2 s as
`meshd testnet up` sets them, the semantic cache off) is started. Then, alternating for
``--rounds`` rounds, the CPU time of node1 (utime + stime of the whole process, every thread,
from /proc/PID/stat) is read over ``--seconds``:

* idle: no console open (no browser at all);
* console: headless Chromium holds node1's console open on its default view, the map, after
  the key was entered and the three nodes were drawn (each round a fresh browser and profile).

Goals: the page under 300 kB transferred at load, and node1's CPU with the console open at most
1% of a core above idle (the difference of the medians over rounds).

Bytes at load: what the browser's performance API says it transferred (``transferSize``:
headers and bodies, after gzip) for the document and every resource fetched until the map shows,
plus the event stream's first two events (the request backlog and the first map), read once
with a plain HTTP client, since a stream still open has no performance entry yet. The stream's
steady rate (bytes per second of the maps that follow) is reported too.

    flock /tmp/meshd-bench.lock .venv/bin/python benchmarks/bench_console.py --out FILE
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("MESHD_TESTNET_CACHE", "0")  # the daemons load no embedding model

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import h11  # noqa: E402
import trio  # noqa: E402

from meshd.testing import browser  # noqa: E402
from meshd.testing.wait import wait_for  # noqa: E402
from meshd.testnet import launcher  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE_BUDGET_BYTES = 300_000
CPU_BUDGET_PCT = 1.0


def cpu_seconds(pid: int) -> float:
    """utime + stime of process ``pid`` (all its threads), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # fields 14 and 15 of stat(5)


def cpu_pct(pid: int, seconds: float) -> float:
    """The share of one core ``pid`` used over the next ``seconds`` of wall time."""
    c0, t0 = cpu_seconds(pid), time.monotonic()
    deadline = t0 + seconds
    while time.monotonic() < deadline:  # the measurement window itself: nothing to wait on
        time.sleep(min(1.0, deadline - time.monotonic()))
    return 100.0 * (cpu_seconds(pid) - c0) / (time.monotonic() - t0)


def open_console(url: str, key: str, profile: Path) -> tuple[Any, dict[str, int]]:
    """A browser holding the console at ``url`` open, the key entered, three nodes drawn; and
    the bytes it transferred by then, per path."""
    from selenium.webdriver.common.by import By

    driver = browser.open_chromium(profile)
    try:
        driver.get(url)
        wait_for(lambda: driver.find_element(By.ID, "key-input").is_displayed(), 15, "the key form")
        driver.find_element(By.ID, "key-input").send_keys(key + "\n")
        wait_for(lambda: len(driver.find_elements(By.CSS_SELECTOR, "#map-nodes .node")) == 3, 15,
                 "three nodes on the map")
        errors = browser.console_errors(driver)
        if errors:
            raise AssertionError(f"console errors: {errors}")
        return driver, browser.bytes_at_load(driver)
    except BaseException:
        driver.quit()
        raise


async def stream_bytes(host: str, port: int, key: str, seconds: float) -> tuple[int, int]:
    """Read /ui/api/events for ``seconds``: (bytes received until its first two events had
    come, the response head included; bytes received after them), as they came off the socket
    (chunked framing included)."""
    conn = h11.Connection(h11.CLIENT)
    total = first = events = 0
    stream = await trio.open_tcp_stream(host, port)
    async with stream:
        await stream.send_all((conn.send(h11.Request(method="GET", target="/ui/api/events", headers=[
            ("host", host), ("authorization", f"Bearer {key}")])) or b"") + (conn.send(h11.EndOfMessage()) or b""))
        with trio.move_on_after(seconds):
            while True:
                data = await stream.receive_some(65536)
                if not data:
                    break
                total += len(data)
                conn.receive_data(data)
                while (ev := conn.next_event()) is not h11.NEED_DATA:
                    if isinstance(ev, h11.Data):
                        events += bytes(ev.data).count(b"\n\n")
                if not first and events >= 2:
                    first = total
    return first, total - first


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=60.0, help="each CPU window (default 60)")
    ap.add_argument("--rounds", type=int, default=2, help="idle/console window pairs (default 2)")
    ap.add_argument("--settle", type=float, default=20.0,
                    help="seconds after the mesh forms before the first window (default 20)")
    ap.add_argument("--out", help="write the figures here as JSON")
    args = ap.parse_args()
    why = browser.missing()
    if why is not None:
        print(f"bench_console: no browser: {why}", file=sys.stderr)
        return 2

    tmp = Path(tempfile.mkdtemp(prefix="bench-console-"))
    net = tmp / "net"
    index = launcher.up(net, launcher.default_specs(3), advert_interval_s=2.0)
    try:
        node1 = index["nodes"][0]
        pid = node1["pid"]
        key = Path(index["api_key_file"]).read_text().strip()
        url = node1["api_url"].removesuffix("/v1") + "/ui/"
        host, port = node1["host"], int(node1["api_url"].rsplit(":", 1)[1].split("/")[0])
        print(f"testnet up in {net}; node1 pid {pid}; settling {args.settle:.0f} s", flush=True)
        cpu_pct(pid, args.settle)  # let start-up work (first adverts, Vivaldi) pass

        idle: list[float] = []
        with_console: list[float] = []
        loads: list[dict[str, int]] = []
        for r in range(args.rounds):
            idle.append(cpu_pct(pid, args.seconds))
            print(f"round {r + 1}: idle {idle[-1]:.2f}% of a core", flush=True)
            driver, load = open_console(url, key, tmp / f"profile-{r}")
            try:
                loads.append(load)
                with_console.append(cpu_pct(pid, args.seconds))
                if browser.console_errors(driver):
                    raise AssertionError(f"console errors: {browser.console_errors(driver)}")
            finally:
                driver.quit()
            print(f"round {r + 1}: console open {with_console[-1]:.2f}% of a core; page "
                  f"{sum(load.values())} bytes", flush=True)
        first_events, rest = trio.run(stream_bytes, host, port, key, 20.0)
    finally:
        launcher.down(net)

    page = max(sum(load.values()) for load in loads)
    at_load = page + first_events
    delta = statistics.median(with_console) - statistics.median(idle)
    result = {
        "bench": "console", "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": f"{platform.machine()}, {os.cpu_count()} cpus", "load_1m": os.getloadavg()[0],
        "window_s": args.seconds, "rounds": args.rounds,
        "cpu_idle_pct": [round(x, 3) for x in idle],
        "cpu_console_pct": [round(x, 3) for x in with_console],
        "cpu_added_pct_of_core": round(delta, 3),
        "page_bytes_by_path": loads[-1], "page_bytes": page,
        "event_stream_first_bytes": first_events,
        "event_stream_bytes_per_s": round(rest / 18.0, 1),  # the 20 s read less the first map's 2 s
        "bytes_at_load": at_load,
        "goals": {"bytes_at_load_under": PAGE_BUDGET_BYTES, "cpu_added_pct_at_most": CPU_BUDGET_PCT},
        "met": {"bytes": at_load < PAGE_BUDGET_BYTES, "cpu": delta <= CPU_BUDGET_PCT},
    }
    print(json.dumps(result, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
