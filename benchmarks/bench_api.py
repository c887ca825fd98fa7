"""What the HTTP API costs next to the control socket, on one real daemon (issue 14's figures).

One `meshd run` daemon serves the model; a client process (this one) sends the same requests
through both doors, alternating, so both see the same machine state:

* first token: from sending the request on an open connection (control: after HELLO; HTTP: a
  keep-alive connection) to receiving the first token; p50 through each and the difference of
  medians = what the API adds (goal: at most 1.5 ms);
* throughput: 32 concurrent clients each streaming requests back to back for a fixed time, through
  each door in turn; total tokens/s received and errors (goal: API >= 0.9x control, 0 errors);
* idle connections: the daemon's RSS before and after 200 keep-alive HTTP connections that each
  made one request and stay open (goal: under 20 MB).

The HTTP client is h11 on a raw trio stream (no client library's own cost in the figures); the
control client is meshd's framed socket protocol. Both ask for greedy decoding with the answer
cache off. The model is a tiny random Llama (hidden 32, 4 layers) so that the doors, not the
engine, dominate; pass ``--model DIR`` to use another.

    .venv/bin/python benchmarks/bench_api.py [--requests 200] [--clients 32] [--seconds 40] [--rounds 4]
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
import uuid
from pathlib import Path
from typing import Any

# the daemons this benchmark starts answer from a model, never from the semantic cache
os.environ.setdefault("MESHD_TESTNET_CACHE", "0")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "engine"))

import h11  # noqa: E402
import trio  # noqa: E402

from meshd.control.client import connect, raise_if_error  # noqa: E402
from meshd.core.messages import MessageType  # noqa: E402
from meshd.testnet import launcher  # noqa: E402

PROMPT = "Once upon a time"
FIRST_TEXT = re.compile(rb'"delta":\{"content":"[^"]')  # a chunk with text (not the role chunk)


def tiny_model(base: Path) -> Path:
    from hf_fixtures import CHAT_TEMPLATE, make_checkpoint

    from meshd.engine import import_hf

    make_checkpoint(base / "hf", layers=4, hidden=32, seed=7, chat_template=CHAT_TEMPLATE)
    import_hf(base / "hf", base / "model", stages=1, name="tiny")
    return base / "model"


def one_node(base: Path, name: str, model_arg: str | None) -> tuple[dict[str, Any], str, int, str]:
    """One daemon under ``base`` serving ``model_arg`` (default: a tiny random Llama), 8 at a
    time with a queue of 128: its testnet index node, API host and port, and the API key."""
    model = Path(model_arg) if model_arg else tiny_model(base)
    os.environ["MESHD_DEFAULT_MODEL"] = str(model)
    spec = launcher.NodeSpec(name=name, models=[{"path": "default", "max_concurrency": 8,
                                                 "max_queue": 128}])
    index = launcher.up(base / "net", [spec], advert_interval_s=2.0)
    node = index["nodes"][0]
    key = Path(index["api_key_file"]).read_text().strip()
    return node, node["host"], int(node["api_url"].rsplit(":", 1)[1].split("/")[0]), key


# ----------------------------------------------------------------------------- control socket


async def control_request(sock: str, max_tokens: int) -> tuple[float, int]:
    """(ms from SUBMIT sent to the first TOKENS frame with text, tokens received)."""
    fields = {"rid": uuid.uuid4().hex[:16], "prompt": PROMPT, "chat": True, "max_tokens": max_tokens,
              "temperature": 0.0, "cache": False}
    async with connect(sock) as framed:
        t0 = time.perf_counter()
        await framed.send(MessageType.SUBMIT, fields)
        first = None
        n = 0
        while True:
            with trio.fail_after(120):
                msg = await framed.recv()
            if msg is None:
                raise RuntimeError("the daemon closed the control connection")
            raise_if_error(msg)
            if msg["t"] == MessageType.TOKENS:
                if first is None and msg.get("text"):  # as an API client sees it: text
                    first = (time.perf_counter() - t0) * 1000
                n += len(msg["ids"])
            elif msg["t"] == MessageType.DONE:
                assert first is not None
                return first, n


# ----------------------------------------------------------------------------- HTTP (h11)


class HttpConn:
    """One keep-alive HTTP/1.1 connection (h11 on a trio stream)."""

    def __init__(self, stream: trio.SocketStream, host: str, key: str) -> None:
        self.stream = stream
        self.conn = h11.Connection(h11.CLIENT)
        self.host = host
        self.key = key
        self.on_bytes: Any = None  # called with raw bytes as they arrive, before parsing
        self.on_send: Any = None  # called as the request's bytes, already built, are sent

    @classmethod
    async def open(cls, host: str, port: int, key: str) -> HttpConn:
        return cls(await trio.open_tcp_stream(host, port), f"{host}:{port}", key)

    async def _event(self) -> Any:
        while True:
            ev = self.conn.next_event()
            if ev is h11.NEED_DATA:
                data = await self.stream.receive_some(65536)
                if self.on_bytes is not None:
                    self.on_bytes(data)
                self.conn.receive_data(data)
                continue
            return ev

    async def request(self, method: str, path: str, body: bytes = b"",
                      on_data: Any = None) -> tuple[int, bytes]:
        headers = [("host", self.host), ("authorization", f"Bearer {self.key}"),
                   ("content-type", "application/json"), ("content-length", str(len(body)))]
        data = (self.conn.send(h11.Request(method=method, target=path, headers=headers))
                + self.conn.send(h11.Data(data=body)) + self.conn.send(h11.EndOfMessage()))
        if self.on_send is not None:
            self.on_send()
        await self.stream.send_all(data)
        status = 0
        parts = []
        while True:
            ev = await self._event()
            if isinstance(ev, h11.Response):
                status = ev.status_code
            elif isinstance(ev, h11.Data):
                parts.append(bytes(ev.data))
                if on_data is not None:
                    on_data(bytes(ev.data))
            elif isinstance(ev, h11.EndOfMessage):
                self.conn.start_next_cycle()
                return status, b"".join(parts)
            elif isinstance(ev, h11.ConnectionClosed):
                raise RuntimeError("the server closed the connection")

    async def aclose(self) -> None:
        await self.stream.aclose()


async def http_request(conn: HttpConn, model: str, max_tokens: int) -> tuple[float, int]:
    """(ms from the request sent to the first content chunk, tokens received) of a streamed chat
    completion; counts tokens from the final usage chunk."""
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": PROMPT}],
                       "max_tokens": max_tokens, "temperature": 0, "cache": False, "stream": True,
                       "stream_options": {"include_usage": True}}).encode()
    first: list[float] = []
    t0 = time.perf_counter()

    def on_send() -> None:  # timed from the request's bytes going out, as the control client's
        nonlocal t0
        t0 = time.perf_counter()

    def on_bytes(data: bytes) -> None:
        # the first token's bytes arriving (the role chunk's content is ""): timed as the bytes
        # land, like the control client's frame, so the client's HTTP parsing is not counted
        if not first and FIRST_TEXT.search(data):
            first.append((time.perf_counter() - t0) * 1000)

    conn.on_bytes, conn.on_send = on_bytes, on_send
    try:
        status, raw = await conn.request("POST", "/v1/chat/completions", body)
    finally:
        conn.on_bytes = conn.on_send = None
    if status != 200 or not raw.endswith(b"data: [DONE]\n\n"):
        raise RuntimeError(f"HTTP {status}: {raw[:300]!r}")
    usage = json.loads(raw.split(b"\n\n")[-3][len(b"data: "):])["usage"]
    if not first:
        raise RuntimeError("no content chunk")
    return first[0], int(usage["completion_tokens"])


# ----------------------------------------------------------------------------- figures


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def pct(xs: list[float], q: float) -> float:
    ys = sorted(xs)
    return ys[min(len(ys) - 1, int(q * len(ys)))]


async def ttft(sock: str, host: str, port: int, key: str, model: str, n: int,
               pid: int) -> dict[str, Any]:
    """First-token times through both doors, alternating request by request; and the daemon's
    CPU per request of each door (clock ticks summed over the requests: a figure the machine's
    other load changes little)."""
    conn = await HttpConn.open(host, port, key)
    times: dict[str, list[float]] = {"api": [], "control": []}
    cpu: dict[str, float] = {"api": 0.0, "control": 0.0}

    async def one(door: str) -> None:
        c0 = cpu_s(pid)
        if door == "api":
            times[door].append((await http_request(conn, model, 2))[0])
        else:
            times[door].append((await control_request(sock, 2))[0])
        cpu[door] += cpu_s(pid) - c0

    for _ in range(5):  # warm both paths
        await control_request(sock, 2)
        await http_request(conn, model, 2)
    for i in range(n):
        for door in (("api", "control") if i % 2 else ("control", "api")):
            await one(door)
    await conn.aclose()
    api, ctl = times["api"], times["control"]
    return {"requests_each": n, "api_p50_ms": round(statistics.median(api), 3),
            "api_p90_ms": round(pct(api, 0.9), 3), "control_p50_ms": round(statistics.median(ctl), 3),
            "control_p90_ms": round(pct(ctl, 0.9), 3),
            "added_p50_ms": round(statistics.median(api) - statistics.median(ctl), 3),
            "daemon_cpu_ms_per_request": {d: round(cpu[d] * 1000 / n, 3) for d in cpu}}


async def chain_ttft(host: str, port: int, key: str) -> dict[str, float]:
    """Mean time from the entry chain taking a request in to its first token, by origin (the
    node's own meshd_time_to_first_token_seconds): the part of the first-token time that is
    the mesh's, the same for both doors when the doors cost the same."""
    from prometheus_client.parser import text_string_to_metric_families

    conn = await HttpConn.open(host, port, key)
    _, raw = await conn.request("GET", "/metrics")
    await conn.aclose()
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(raw.decode()):
        for sample in family.samples:
            if sample.name == "meshd_time_to_first_token_seconds_sum":
                sums[sample.labels["origin"]] = sample.value
            elif sample.name == "meshd_time_to_first_token_seconds_count":
                counts[sample.labels["origin"]] = sample.value
    return {o: round(sums[o] / counts[o] * 1000, 3) for o in sums if counts.get(o)}


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def throughput(door: str, sock: str, host: str, port: int, key: str, model: str,
                     clients: int, seconds: float, max_tokens: int, pid: int) -> dict[str, Any]:
    tokens = 0
    errors: list[str] = []
    requests = 0
    deadline = trio.current_time() + seconds

    async def client() -> None:
        nonlocal tokens, requests
        conn = await HttpConn.open(host, port, key) if door == "api" else None
        try:
            while trio.current_time() < deadline:
                try:
                    if conn is not None:
                        _, n = await http_request(conn, model, max_tokens)
                    else:
                        _, n = await control_request(sock, max_tokens)
                    tokens += n
                    requests += 1
                except Exception as e:  # counted, not fatal: the figure is the error count
                    errors.append(f"{type(e).__name__}: {e}")
                    if conn is not None:
                        await conn.aclose()
                        conn = await HttpConn.open(host, port, key)
        finally:
            if conn is not None:
                await conn.aclose()

    t0 = trio.current_time()
    daemon0, client0 = cpu_s(pid), time.process_time()
    async with trio.open_nursery() as nursery:
        for _ in range(clients):
            nursery.start_soon(client)
    took = trio.current_time() - t0
    daemon_cpu, client_cpu = cpu_s(pid) - daemon0, time.process_time() - client0
    return {"door": door, "clients": clients, "seconds": round(took, 2), "requests": requests,
            "tokens": tokens, "tokens_per_s": round(tokens / took, 1), "errors": len(errors),
            "daemon_cpu_ms_per_token": round(daemon_cpu * 1000 / max(tokens, 1), 4),
            "client_cpu_ms_per_token": round(client_cpu * 1000 / max(tokens, 1), 4),
            "first_errors": errors[:3]}


def _total(rs: list[dict[str, Any]]) -> dict[str, Any]:
    tokens = sum(r["tokens"] for r in rs)
    seconds = sum(r["seconds"] for r in rs)
    return {"clients": rs[0]["clients"], "seconds": round(seconds, 2), "tokens": tokens,
            "requests": sum(r["requests"] for r in rs), "tokens_per_s": round(tokens / seconds, 1),
            "errors": sum(r["errors"] for r in rs),
            "daemon_cpu_ms_per_token": round(sum(r["daemon_cpu_ms_per_token"] * r["tokens"]
                                                 for r in rs) / max(tokens, 1), 4)}


async def idle_connections(pid: int, host: str, port: int, key: str, n: int) -> dict[str, Any]:
    warm = [await HttpConn.open(host, port, key) for _ in range(4)]
    for c in warm:
        await c.request("GET", "/healthz")
    await trio.sleep(1)
    before = rss_mb(pid)
    conns = []
    for _ in range(n):
        c = await HttpConn.open(host, port, key)
        status, _ = await c.request("GET", "/healthz")
        assert status == 200
        conns.append(c)
    await trio.sleep(2)
    after = rss_mb(pid)
    status, _ = await conns[0].request("GET", "/healthz")  # still open, still answered
    for c in conns + warm:
        await c.aclose()
    return {"connections": n, "rss_before_mb": round(before, 1), "rss_after_mb": round(after, 1),
            "added_mb": round(after - before, 2), "still_open": status == 200}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="model directory (default: a tiny random Llama)")
    ap.add_argument("--requests", type=int, default=200, help="first-token samples per door")
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=40.0, help="per door, for throughput")
    ap.add_argument("--rounds", type=int, default=4, help="alternating throughput rounds")
    ap.add_argument("--tokens", type=int, default=64, help="max_tokens of throughput requests")
    ap.add_argument("--idle", type=int, default=200, help="idle keep-alive connections")
    ap.add_argument("--out", help="write the figures as JSON here")
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="meshd-bench-api-"))
    node, host, port, key = one_node(base, "api1", args.model)
    try:
        async def run_all() -> dict[str, Any]:
            res: dict[str, Any] = {}
            conn = await HttpConn.open(host, port, key)
            status, raw = await conn.request("GET", "/v1/models")
            await conn.aclose()
            model_name = json.loads(raw)["data"][0]["id"]
            pid = int(node["pid"])
            res["ttft"] = await ttft(node["socket"], host, port, key, model_name, args.requests, pid)
            res["ttft"]["entry_chain_mean_ms"] = await chain_ttft(host, port, key)
            print(json.dumps(res["ttft"]), flush=True)
            rounds: dict[str, list[dict[str, Any]]] = {"control": [], "api": []}
            for r in range(args.rounds):  # alternating, so load that drifts hits both doors
                for door in (("control", "api") if r % 2 == 0 else ("api", "control")):
                    tp = await throughput(door, node["socket"], host, port, key, model_name,
                                          args.clients, args.seconds / args.rounds, args.tokens, pid)
                    print(json.dumps(tp), flush=True)
                    rounds[door].append(tp)
            res["throughput"] = {door: _total(rs) for door, rs in rounds.items()}
            res["throughput"]["rounds"] = rounds
            res["throughput"]["api_over_control"] = round(
                res["throughput"]["api"]["tokens_per_s"] / res["throughput"]["control"]["tokens_per_s"], 3)
            # both doors at once, clients of each: the same machine state for both, whatever the
            # rest of the box does (the ratio of what each door's clients receive)
            mixed: dict[str, dict[str, Any]] = {}

            async def door_run(door: str) -> None:
                mixed[door] = await throughput(door, node["socket"], host, port, key, model_name,
                                               args.clients, args.seconds / 2, args.tokens, pid)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(door_run, "control")
                nursery.start_soon(door_run, "api")
            for tp in mixed.values():
                tp.pop("daemon_cpu_ms_per_token")  # shared by both doors: not theirs alone
                tp.pop("client_cpu_ms_per_token")
            mixed["api_over_control"] = {"ratio": round(
                mixed["api"]["tokens_per_s"] / mixed["control"]["tokens_per_s"], 3)}
            res["throughput_mixed"] = mixed
            print(json.dumps(mixed), flush=True)
            res["idle"] = await idle_connections(int(node["pid"]), host, port, key, args.idle)
            print(json.dumps(res["idle"]), flush=True)
            return res

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
