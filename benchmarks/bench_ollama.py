"""What Ollama's API costs next to the control socket (and the OpenAI API), on one real daemon.

One `meshd run` daemon serves the model; this process sends the same request through three
doors, round-robin with the order rotating, so all see the same machine state:

* control: SUBMIT on meshd's control socket, timed to the first TOKENS frame with text;
* openai: a streamed ``POST /v1/chat/completions`` on a keep-alive connection, timed to the first
  content chunk's bytes (bench_api.py's client);
* ollama: a streamed ``POST /api/chat`` (NDJSON) on a keep-alive connection, timed to the first
  line with text's bytes.

The figure is the difference of medians, ollama minus control: what the Ollama layer and the
HTTP server add to the first token (goal: at most 1.5 ms, as the OpenAI API). The daemon's CPU
per request of each door is summed from /proc. Greedy, 2 tokens, the answer cache off; the model
is a tiny random Llama (hidden 32, 4 layers) so that the doors, not the engine, dominate.

    .venv/bin/python benchmarks/bench_ollama.py [--requests 200] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import trio  # noqa: E402
from bench_api import (  # noqa: E402  (sets MESHD_TESTNET_CACHE=0 and the import paths)
    PROMPT,
    HttpConn,
    control_request,
    cpu_s,
    http_request,
    one_node,
    pct,
)

from meshd.testnet import launcher  # noqa: E402

FIRST_TEXT = re.compile(rb'"content":"[^"]')  # a line with text (the last line's content is "")


async def ollama_request(conn: HttpConn, model: str, max_tokens: int) -> tuple[float, int]:
    """(ms from the request sent to the first line with text, tokens received) of a streamed
    Ollama chat; counts tokens from the last line's eval_count."""
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": PROMPT}],
                       "options": {"num_predict": max_tokens, "temperature": 0},
                       "cache": False}).encode()
    first: list[float] = []
    t0 = time.perf_counter()

    def on_send() -> None:
        nonlocal t0
        t0 = time.perf_counter()

    def on_bytes(data: bytes) -> None:
        if not first and FIRST_TEXT.search(data):
            first.append((time.perf_counter() - t0) * 1000)

    conn.on_bytes, conn.on_send = on_bytes, on_send
    try:
        status, raw = await conn.request("POST", "/api/chat", body)
    finally:
        conn.on_bytes = conn.on_send = None
    last = json.loads(raw.rstrip(b"\n").rsplit(b"\n", 1)[-1])
    if status != 200 or not last.get("done"):
        raise RuntimeError(f"HTTP {status}: {raw[:300]!r}")
    if not first:
        raise RuntimeError("no line with text")
    return first[0], int(last["eval_count"])


async def ttft(sock: str, host: str, port: int, key: str, model: str, n: int,
               pid: int) -> dict[str, Any]:
    openai_conn = await HttpConn.open(host, port, key)
    ollama_conn = await HttpConn.open(host, port, key)
    doors = ("control", "openai", "ollama")
    times: dict[str, list[float]] = {d: [] for d in doors}
    cpu: dict[str, float] = {d: 0.0 for d in doors}

    async def one(door: str) -> float:
        if door == "control":
            return (await control_request(sock, 2))[0]
        if door == "openai":
            return (await http_request(openai_conn, model, 2))[0]
        return (await ollama_request(ollama_conn, model, 2))[0]

    for _ in range(5):  # warm every path
        for door in doors:
            await one(door)
    for i in range(n):
        for door in doors[i % 3:] + doors[:i % 3]:
            c0 = cpu_s(pid)
            times[door].append(await one(door))
            cpu[door] += cpu_s(pid) - c0
    await openai_conn.aclose()
    await ollama_conn.aclose()
    p50 = {d: statistics.median(times[d]) for d in doors}
    return {
        "requests_each": n,
        **{f"{d}_p50_ms": round(p50[d], 3) for d in doors},
        **{f"{d}_p90_ms": round(pct(times[d], 0.9), 3) for d in doors},
        "ollama_added_p50_ms": round(p50["ollama"] - p50["control"], 3),
        "openai_added_p50_ms": round(p50["openai"] - p50["control"], 3),
        "ollama_minus_openai_p50_ms": round(p50["ollama"] - p50["openai"], 3),
        "daemon_cpu_ms_per_request": {d: round(cpu[d] * 1000 / n, 3) for d in doors},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="model directory (default: a tiny random Llama)")
    ap.add_argument("--requests", type=int, default=200, help="first-token samples per door")
    ap.add_argument("--out", help="write the figures as JSON here")
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="meshd-bench-ollama-"))
    node, host, port, key = one_node(base, "ollama1", args.model)
    try:
        async def run_all() -> dict[str, Any]:
            conn = await HttpConn.open(host, port, key)
            _, raw = await conn.request("GET", "/api/tags")
            await conn.aclose()
            model_name = json.loads(raw)["models"][0]["model"]
            return {"ttft": await ttft(node["socket"], host, port, key, model_name,
                                       args.requests, int(node["pid"]))}

        res = trio.run(run_all)
    finally:
        launcher.down(base / "net")
        shutil.rmtree(base, ignore_errors=True)
    res["machine"] = {"cpus": os.cpu_count(), "python": platform.python_version(),
                      "load_avg": os.getloadavg()}
    print(json.dumps(res, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
