"""The console's HTTP side (meshd/api/console/app.py) on a fake node, over real HTTP: the page and
its files, the key on every data call, the event stream, explanations, the node page, and the
pieces in words (requests, metrics, configuration)."""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import h11
import httpx
import pytest
import trio

from meshd.api.auth import add_key
from meshd.api.console.app import PREFIX, load_assets, sse_event
from meshd.api.console.requests import RecentRequests, request_row
from meshd.api.console.words import config_summary, metrics_in_words
from meshd.api.metrics import Metrics
from meshd.api.server import serve_api
from meshd.cli.testnet import console_url
from meshd.config import parse_config
from meshd.testing.fake_console import FakeConsole
from meshd.testing.fake_entry import FakeNode

STATIC = Path(__file__).resolve().parents[2] / "meshd" / "api" / "console" / "static"


@asynccontextmanager
async def console(tmp: Path, source: FakeConsole | None = None, node: FakeNode | None = None,
                  **api: Any) -> AsyncIterator[tuple[httpx.AsyncClient, str, FakeNode]]:
    key = add_key(tmp / "api-keys", "alice")
    cfg = parse_config({"api": {"listen": "127.0.0.1:0", "keys_file": "api-keys", **api},
                        "gossip": {"advert_interval_s": 0.2}}, base_dir=str(tmp))
    node = node or FakeNode()
    src = source or FakeConsole(config=cfg)
    async with trio.open_nursery() as nursery:
        url = await nursery.start(serve_api, node, cfg, src)
        async with httpx.AsyncClient(base_url=url.removesuffix("/v1"), timeout=10) as client:
            yield client, key, node
        nursery.cancel_scope.cancel()


def run(tmp: Path, body: Callable[[httpx.AsyncClient, str, FakeNode], Awaitable[None]],
        **kw: Any) -> None:
    async def main() -> None:
        async with console(tmp, **kw) as (client, key, node):
            await body(client, key, node)

    trio.run(main)


def auth(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def test_the_page_and_its_files(tmp_path: Path) -> None:
    async def body(c: httpx.AsyncClient, key: str, node: FakeNode) -> None:
        r = await c.get("/ui", follow_redirects=False)
        assert r.status_code == 308 and r.headers["location"] == "/ui/"
        r = await c.get("/ui/")
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
        assert "<title>meshd console</title>" in r.text
        csp = r.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "unsafe-inline" not in csp
        # every file the page and its modules name is served (no network fetch elsewhere)
        names = set(re.findall(r'(?:src|href)="/ui/([\w.-]+)"', r.text))
        for js in STATIC.glob("*.js"):
            names |= set(re.findall(r'from "\./([\w.-]+)"', js.read_text()))
        assert {"main.js", "console.css", "map.js", "net.js"} <= names
        for name in sorted(names):
            got = await c.get(f"/ui/{name}")
            assert got.status_code == 200, name
            assert got.content == (STATIC / name).read_bytes()
        code = "".join(p.read_text() for p in STATIC.glob("*.js")).replace("http://www.w3.org/2000/svg", "")
        assert not re.search(r"https?://", code)  # nothing from elsewhere (the SVG namespace is a name)

        raw = await c.get("/ui/main.js", headers={"accept-encoding": "gzip"})
        assert raw.headers["content-encoding"] == "gzip"
        assert raw.content == (STATIC / "main.js").read_bytes()  # httpx decodes it
        etag = raw.headers["etag"]
        again = await c.get("/ui/main.js", headers={"if-none-match": etag})
        assert again.status_code == 304 and again.content == b""
        assert (await c.get("/ui/nothing.js")).status_code == 404
        assert (await c.get("/ui/../app.py")).status_code == 404
        assert (await c.post("/ui/api/node", headers=auth(key))).status_code == 405
        assert (await c.head("/ui/api/events", headers=auth(key))).status_code == 405
        head = await c.head("/ui/main.js")
        assert head.status_code == 200 and head.content == b""
        assert (await c.get("/healthz")).status_code == 200  # the API's own routes are unchanged

    run(tmp_path, body)


def test_data_needs_the_key_and_whoami_says_so_without_an_error(tmp_path: Path) -> None:
    async def body(c: httpx.AsyncClient, key: str, node: FakeNode) -> None:
        for path in ("node", "metrics", "events", "requests/abc"):
            r = await c.get(f"/ui/api/{path}")
            assert r.status_code == 401, path
            assert (await c.get(f"/ui/api/{path}", headers=auth("meshd-wrong"))).status_code == 401
        r = await c.get("/ui/api/whoami")
        assert r.status_code == 200 and r.json() == {
            "ok": False, "why": "no API key given (send Authorization: Bearer KEY)", "auth": "key"}
        r = await c.get("/ui/api/whoami", headers=auth(key))
        assert r.json()["ok"] is True and r.json()["client"] == "alice" and r.json()["node"] == "fake1"
        assert (await c.get("/ui/api/nothing", headers=auth(key))).status_code == 404

    run(tmp_path, body)


def test_no_key_needed_when_auth_is_none(tmp_path: Path) -> None:
    async def body(c: httpx.AsyncClient, key: str, node: FakeNode) -> None:
        r = await c.get("/ui/api/whoami")
        assert r.json()["ok"] is True and r.json()["client"] == "anonymous"
        assert (await c.get("/ui/api/node")).status_code == 200

    run(tmp_path, body, auth="none")


async def _events(c: httpx.AsyncClient, key: str, until: Callable[[list[tuple[str, Any]]], bool],
                  ) -> list[tuple[str, Any]]:
    """The events of one /ui/api/events stream until ``until(events)``, read with h11 over a
    socket of this test's own (an httpx stream left early leaves its generators to the GC)."""
    host, port = c.base_url.host, c.base_url.port
    assert port is not None
    conn = h11.Connection(h11.CLIENT)
    got: list[tuple[str, Any]] = []
    buf = b""
    with trio.fail_after(10):
        stream = await trio.open_tcp_stream(host, port)
        async with stream:
            await stream.send_all(conn.send(h11.Request(method="GET", target="/ui/api/events", headers=[
                ("host", host), ("authorization", f"Bearer {key}")])) or b"")
            await stream.send_all(conn.send(h11.EndOfMessage()) or b"")
            while True:
                ev = conn.next_event()
                if ev is h11.NEED_DATA:
                    data = await stream.receive_some(65536)
                    if not data:
                        raise AssertionError(f"the stream ended: {got}")
                    conn.receive_data(data)
                elif isinstance(ev, h11.Response):
                    assert ev.status_code == 200
                    assert dict(ev.headers)[b"content-type"].startswith(b"text/event-stream")
                elif isinstance(ev, h11.Data):
                    buf += bytes(ev.data)
                    while b"\n\n" in buf:
                        block, buf = buf.split(b"\n\n", 1)
                        lines = dict(line.split(": ", 1) for line in block.decode().split("\n"))
                        got.append((lines["event"], json.loads(lines["data"])))
                    if until(got):
                        return got
                else:
                    raise AssertionError(f"the stream ended ({ev}): {got}")


def test_the_stream_sends_the_map_each_interval_and_requests_as_they_end(tmp_path: Path) -> None:
    async def body(c: httpx.AsyncClient, key: str, node: FakeNode) -> None:
        got = await _events(c, key, lambda ev: [k for k, _ in ev].count("mesh") >= 2)
        assert got[0] == ("requests", [])
        mesh = got[1][1]
        assert [n["name"] for n in mesh["nodes"]] == ["fake1", "fake2", "fake3"]
        assert [n["state"] for n in mesh["nodes"]] == ["self", "live", "stalled"]
        assert mesh["interval_s"] == 0.2 and mesh["self"] == "12D3KooWfake1"

        async def chat() -> None:
            r = await c.post("/v1/chat/completions", headers=auth(key), json={
                "model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
                "stream": True})
            assert r.status_code == 200

        async with trio.open_nursery() as nursery:
            nursery.start_soon(chat)
            got = await _events(c, key, lambda ev: any(k == "request" for k, _ in ev))
        row = next(v for k, v in got if k == "request")
        assert row["route"] == ["fake1"] and row["served_by"] == "fake1"
        assert row["outcome"] == "ok" and row["origin"] == "http" and row["model"] == "tiny"
        assert row["tokens"] == 3 and row["ttft_ms"] == 1.0
        # a new stream starts with it in its backlog
        got = await _events(c, key, lambda ev: bool(ev))
        assert got[0][0] == "requests" and [r["id"] for r in got[0][1]] == [row["id"]]

    run(tmp_path, body)


def test_the_map_is_made_once_per_half_interval_for_all_streams(tmp_path: Path) -> None:
    src = FakeConsole()

    async def body(c: httpx.AsyncClient, key: str, node: FakeNode) -> None:
        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(_events, c, key, lambda ev: [k for k, _ in ev].count("mesh") >= 3)
        # 3 streams x 3 maps over ~0.4 s of 0.2 s intervals: at most one map per 0.1 s
        assert src.mesh_calls <= 6

    run(tmp_path, body, source=src)


def test_explain_a_request(tmp_path: Path) -> None:
    record = {"request_id": "req0001", "strategy": "meshd", "chosen": "p2",
              "candidates": [{"name": "fake2", "peer_id": "p2", "predicted_ttft_ms": 12.5,
                              "rtt_ms": 2.0, "rtt_source": "measured", "queue_wait_ms": 0.0}],
              "decision": {"strategy": "meshd", "chosen": "p2", "candidates": []},
              "outcome": {"ttft_ms": 14.0, "tokens": 3, "served_by": "fake2", "route": ["fake2"]},
              "events": []}
    src = FakeConsole(records={"req0001": record})

    async def body(c: httpx.AsyncClient, key: str, node: FakeNode) -> None:
        r = await c.get("/ui/api/requests/req0001", headers=auth(key))
        assert r.status_code == 200
        got = r.json()
        assert got["record"]["candidates"][0]["name"] == "fake2"
        assert "served by fake2" in got["text"]
        assert (await c.get("/ui/api/requests/nope", headers=auth(key))).status_code == 404
        assert (await c.get("/ui/api/requests/a%20b", headers=auth(key))).status_code == 400

    run(tmp_path, body, source=src)


def test_the_node_page_and_metrics(tmp_path: Path) -> None:
    src = FakeConsole(events=[{"ts": 1.0, "kind": "config_loaded", "peer_id": "", "reason": "",
                               "detail": {"sha256": "ab"}}])

    async def body(c: httpx.AsyncClient, key: str, node: FakeNode) -> None:
        got = (await c.get("/ui/api/node", headers=auth(key))).json()
        assert got["identity"]["certificate"]["serial"] == 7
        assert got["status"]["name"] == "fake1"
        assert got["audit"][0]["kind"] == "config_loaded"
        assert {s["section"] for s in got["config"]} >= {"node", "api", "gossip", "models[0]"}
        metrics = (await c.get("/ui/api/metrics", headers=auth(key))).json()["metrics"]
        by_name = {m["name"]: m for m in metrics}
        assert by_name["meshd_forwards"]["what"].startswith("Request attempts")
        assert by_name["meshd_forwards"]["values"] == [{"labels": "", "said": "4"}]

    run(tmp_path, body, source=src)


# ------------------------------------------------------------------ the pure parts


def test_request_row_and_the_list() -> None:
    stats = {"request_id": "r1", "outcome": "ok", "origin": "http", "model": "tiny",
             "strategy": "meshd", "served_by": "n2", "route": ["n2"], "ttft_ms": 12.345,
             "completion_tokens": 9, "tokens_per_s": 40.04, "cache_lookup": "miss",
             "tier": {"tier": "large", "wanted": "micro", "escalated": True, "lowered": False}}
    row = request_row(stats, 100.0)
    assert row["ttft_ms"] == 12.3 and row["tokens"] == 9 and row["tokens_per_s"] == 40.0
    assert row["cache"] == "miss" and row["tier"]["escalated"] is True and row["route"] == ["n2"]
    assert request_row({"cached": True}, 0.0)["cache"] == "hit"
    assert request_row({}, 0.0)["cache"] is None

    seen: list[int] = []
    recent = RecentRequests(lambda: 5.0, max_kept=2)
    recent.on_change = lambda: seen.append(recent.version)
    for i in range(3):
        recent.observe({"request_id": f"r{i}"})
    assert seen == [1, 2, 3] and [r["id"] for r in recent.since(1)] == ["r1", "r2"]
    assert recent.get("r0") is None and recent.get("r2") is not None
    recent.observe({"route": object()})  # junk never raises
    assert recent.version == 3


def test_metrics_in_words() -> None:
    metrics = Metrics(FakeNode())
    metrics.requests.observe({"outcome": "ok", "strategy": "meshd", "origin": "http",
                              "ttft_ms": 20.0, "total_ms": 120.0, "completion_tokens": 11})
    words = {m["name"]: m for m in metrics_in_words(metrics.render().decode())}
    ttft = words["meshd_time_to_first_token_seconds"]
    assert ttft["kind"] == "histogram"
    assert ttft["values"] == [{"labels": "origin=http", "said": "1 observed, mean 20.0 ms"}]
    assert words["meshd_requests"]["values"] == [
        {"labels": "origin=http, outcome=ok, strategy=meshd", "said": "1"}]
    assert "meshd_hedges_fired" not in words  # a counter that never moved is left out


def test_config_summary_names_what_was_set() -> None:
    cfg = parse_config({"node": {"name": "gw-1"}, "routing": {"strategy": "lwsq"},
                        "models": [{"path": "m", "tier": "small"}]}, base_dir="/etc/meshd")
    got = {s["section"]: {k["key"]: (k["value"], k["default"]) for k in s["keys"]} for s in config_summary(cfg)}
    assert got["node"]["name"] == ("gw-1", False)
    assert got["routing"]["strategy"] == ("lwsq", False)
    assert got["api"]["auth"] == ("key", True)  # always shown
    assert "keep_alive_timeout_s" not in got["api"]  # a default, not among the main ones
    assert got["models[0]"] == {"path": ("m", False), "tier": ("small", False)}


def test_sse_event_and_assets() -> None:
    assert sse_event("mesh", {"a": "x\ny"}) == b'event: mesh\ndata: {"a":"x\\ny"}\n\n'
    assets = load_assets()
    assert "index.html" in assets and "main.js" in assets
    assert gzip.decompress(assets["main.js"].gzipped) == assets["main.js"].body
    total = sum(len(a.gzipped) for a in assets.values())
    assert total < 100_000, f"the console's files are {total} bytes gzipped"


@pytest.mark.parametrize("api, ui", [("http://127.0.0.1:8080/v1", "http://127.0.0.1:8080/ui/"),
                                     ("http://[::1]:9/v1", "http://[::1]:9/ui/")])
def test_testnet_prints_the_console_url(api: str, ui: str) -> None:
    assert console_url(api) == ui
    assert PREFIX == "/ui"
