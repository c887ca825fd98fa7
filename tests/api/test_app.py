"""The HTTP API on a fake node (meshd.testing.fake_entry): endpoints, errors, streaming framing,
cancellation on disconnect, metrics. The real-daemon acceptance is tests/api/test_api_live.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import trio
from prometheus_client.parser import text_string_to_metric_families

from meshd.testing.fake_entry import FakeChain, FakeModel, FakeNode

from .helpers import run

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 3}


def auth(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def events(raw: str) -> list[str]:
    """The data of each SSE event; asserts the framing: every event is one data line ended by
    a blank line."""
    assert raw.endswith("\n\n")
    out = []
    for block in raw[:-2].split("\n\n"):
        assert block.startswith("data: ") and "\n" not in block, block
        out.append(block[len("data: "):])
    return out


def test_health_and_readiness(tmp_path: Path) -> None:
    node = FakeNode()

    async def body(c: httpx.AsyncClient, key: str) -> None:
        assert (await c.get("/healthz")).json() == {"status": "ok"}
        assert (await c.get("/readyz")).status_code == 200
        node.is_ready = (False, "no peers and no local model")
        r = await c.get("/readyz")
        assert r.status_code == 503 and r.json()["reason"] == "no peers and no local model"

    run(tmp_path, node, body)


def test_keys_are_required_and_checked(tmp_path: Path) -> None:
    async def body(c: httpx.AsyncClient, key: str) -> None:
        for headers in ({}, auth("meshd-wrong"), {"authorization": f"Basic {key}"}):
            r = await c.post("/v1/chat/completions", json=CHAT, headers=headers)
            assert r.status_code == 401, r.text
            assert r.json()["error"]["code"] == "invalid_api_key"
            assert r.headers["www-authenticate"] == "Bearer"
        assert (await c.get("/v1/models")).status_code == 401
        assert (await c.get("/v1/models", headers=auth(key))).status_code == 200

    run(tmp_path, FakeNode(), body)


def test_open_access_on_loopback_needs_no_key(tmp_path: Path) -> None:
    node = FakeNode()

    async def body(c: httpx.AsyncClient, key: str) -> None:
        r = await c.post("/v1/chat/completions", json=CHAT)
        assert r.status_code == 200
        assert node.entry.requests[-1].client == "anonymous"
        await c.post("/v1/chat/completions", json=CHAT, headers=auth(key))
        assert node.entry.requests[-1].client == "alice"

    run(tmp_path, node, body, auth="none")


def test_models_lists_the_meshs_models(tmp_path: Path) -> None:
    chain = FakeChain(models_served={"tiny": FakeModel("tiny", nodes=3), "big": FakeModel("big")})

    async def body(c: httpx.AsyncClient, key: str) -> None:
        r = (await c.get("/v1/models", headers=auth(key))).json()
        assert r["object"] == "list"
        assert [m["id"] for m in r["data"]] == ["auto", "big", "tiny"]  # auto: meshd picks
        assert all(m["object"] == "model" and m["owned_by"] == "meshd" for m in r["data"])
        assert r["data"][2]["meshd"]["nodes"] == 3 and r["data"][0]["meshd"]["nodes"] == 4
        assert r["data"][2]["meshd"]["context_length"] == 256

    run(tmp_path, FakeNode(chain), body)


def test_a_chat_answer_has_openais_shape_and_the_route_headers(tmp_path: Path) -> None:
    chain = FakeChain(models_served={"tiny": FakeModel("tiny", served_by="n2", route=("n2",))})
    node = FakeNode(chain)

    async def body(c: httpx.AsyncClient, key: str) -> None:
        r = await c.post("/v1/chat/completions", json=CHAT, headers=auth(key))
        assert r.status_code == 200
        rid = r.headers["x-request-id"]
        assert r.headers["x-meshd-served-by"] == "n2" and r.headers["x-meshd-route"] == "n2"
        obj = r.json()
        assert obj["id"] == f"chatcmpl-{rid}" and obj["object"] == "chat.completion"
        assert obj["model"] == "tiny" and isinstance(obj["created"], int)
        (choice,) = obj["choices"]
        assert choice["message"] == {"role": "assistant", "content": " w0 w1 w2", "refusal": None}
        assert choice["finish_reason"] == "length"
        assert obj["usage"] == {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5}
        req = chain.requests[-1]
        assert req.request_id == rid and req.origin == "http" and req.client == "alice"
        assert req.messages == ({"role": "user", "content": "hello there"},)

    run(tmp_path, node, body)


def test_a_streamed_chat_is_framed_as_openai_streams_it(tmp_path: Path) -> None:
    async def body(c: httpx.AsyncClient, key: str) -> None:
        req = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
        r = await c.post("/v1/chat/completions", json=req, headers=auth(key))
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        assert r.headers["x-meshd-served-by"] == "fake1"
        data = events(r.text)
        assert data[-1] == "[DONE]"
        chunks = [json.loads(d) for d in data[:-1]]
        assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
        assert len({c["id"] for c in chunks}) == 1
        assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
        assert text == " w0 w1 w2"
        assert chunks[-2]["choices"][0]["finish_reason"] == "length"
        assert all(c["usage"] is None for c in chunks[:-1])
        assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 3

    run(tmp_path, FakeNode(), body)


def test_legacy_completions_plain_and_streamed(tmp_path: Path) -> None:
    async def body(c: httpx.AsyncClient, key: str) -> None:
        req = {"model": "tiny", "prompt": "Once upon", "max_tokens": 2}
        obj = (await c.post("/v1/completions", json=req, headers=auth(key))).json()
        assert obj["object"] == "text_completion" and obj["id"].startswith("cmpl-")
        assert obj["choices"][0]["text"] == " w0 w1"
        r = await c.post("/v1/completions", json={**req, "stream": True}, headers=auth(key))
        data = events(r.text)
        chunks = [json.loads(d) for d in data[:-1]]
        assert "".join(c["choices"][0]["text"] for c in chunks) == " w0 w1"
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        assert "usage" not in chunks[0]

    run(tmp_path, FakeNode(), body)


def test_errors_have_openais_status_and_shape(tmp_path: Path) -> None:
    chain = FakeChain(models_served={"tiny": FakeModel("tiny", context_length=8)},
                      quotas={"alice": 0})

    async def post(c: httpx.AsyncClient, key: str, path: str = "/v1/chat/completions",
                   **kw: Any) -> httpx.Response:
        return await c.post(path, headers=auth(key), **kw)

    async def body(c: httpx.AsyncClient, key: str) -> None:
        r = await post(c, key, json={**CHAT, "model": "nope"})
        assert (r.status_code, r.json()["error"]["code"]) == (404, "model_not_found")
        r = await post(c, key, json={**CHAT, "max_tokens": 100})
        assert (r.status_code, r.json()["error"]["code"]) == (400, "context_length_exceeded")
        assert r.json()["error"]["param"] == "messages" and "x-request-id" in r.headers
        r = await post(c, key, json={**CHAT, "max_tokens": 0})
        assert (r.status_code, r.json()["error"]["param"]) == (400, "max_tokens")
        r = await post(c, key, json={**CHAT, "max_tokens": 1})
        assert r.status_code == 429 and r.headers["retry-after"] == "1"
        assert r.json()["error"]["code"] == "rate_limit_exceeded"
        chain.quotas.clear()
        chain.busy = True
        r = await post(c, key, json={**CHAT, "max_tokens": 1})
        assert r.status_code == 429 and r.headers["retry-after"] == "3"
        chain.busy, chain.no_route = False, True
        r = await post(c, key, json={**CHAT, "max_tokens": 1})
        assert (r.status_code, r.json()["error"]["type"]) == (503, "server_error")
        r = await post(c, key, content=b"{not json")
        assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
        r = await post(c, key, content=b"x" * 5000)
        assert r.status_code == 413
        r = await c.get("/v1/chat/completions", headers=auth(key))
        assert r.status_code == 405 and r.headers["allow"] == "POST"
        r = await c.get("/v2/nothing", headers=auth(key))
        assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_url"

    run(tmp_path, FakeNode(chain), body, max_body_bytes=4096)


def test_a_failure_after_the_stream_started_is_an_error_event(tmp_path: Path) -> None:
    chain = FakeChain(fail_after_tokens=1)

    async def body(c: httpx.AsyncClient, key: str) -> None:
        r = await c.post("/v1/chat/completions", json={**CHAT, "stream": True}, headers=auth(key))
        assert r.status_code == 200
        data = events(r.text)
        assert data[-1] == "[DONE]"
        err = json.loads(data[-2])["error"]
        assert err["code"] == "peer_gone" and err["type"] == "server_error"

    run(tmp_path, FakeNode(chain), body)


def test_a_failover_mid_stream_is_a_comment_line(tmp_path: Path) -> None:
    chain = FakeChain(reroute_after_tokens=1)

    async def body(c: httpx.AsyncClient, key: str) -> None:
        r = await c.post("/v1/chat/completions", json={**CHAT, "stream": True}, headers=auth(key))
        assert r.headers["x-meshd-served-by"] == "fake1"
        blocks = r.text.split("\n\n")
        assert ": route served_by=fake2 route=fake2" in blocks
        assert blocks[-2] == "data: [DONE]"

    run(tmp_path, FakeNode(chain), body)


def test_a_client_that_goes_away_mid_stream_cancels_the_request(tmp_path: Path) -> None:
    chain = FakeChain(step_s=0.05)

    async def body(c: httpx.AsyncClient, key: str) -> None:
        req = json.dumps({**CHAT, "max_tokens": 200, "stream": True}).encode()
        host, port = str(c.base_url.host), int(c.base_url.port or 80)
        stream = await trio.open_tcp_stream(host, port)
        await stream.send_all(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            + f"authorization: Bearer {key}\r\ncontent-length: {len(req)}\r\n\r\n".encode() + req)
        got = b""
        while got.count(b'"content":" w') < 2:  # two tokens streamed
            got += await stream.receive_some(65536)
        assert got.startswith(b"HTTP/1.1 200")
        await stream.aclose()
        steps_at_close = chain.steps
        # the response is closed: the connection goes, the request is cancelled across the mesh
        with trio.fail_after(5):
            while chain.active:
                await trio.sleep(0.01)
        assert chain.cancelled == 1
        assert chain.steps <= steps_at_close + 1  # stopped within one decode step
        assert chain.in_flight["alice"] == 0  # its slot (and quota) freed

    run(tmp_path, FakeNode(chain), body)


def test_a_client_that_goes_away_before_the_answer_cancels_it_too(tmp_path: Path) -> None:
    chain = FakeChain(step_s=0.05)

    async def body(c: httpx.AsyncClient, key: str) -> None:
        with trio.move_on_after(0.3):
            await c.post("/v1/chat/completions", json={**CHAT, "max_tokens": 200},
                         headers=auth(key))
        with trio.fail_after(5):
            while chain.active:
                await trio.sleep(0.01)
        assert chain.cancelled == 1

    run(tmp_path, FakeNode(chain), body)


def scrape(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_metrics_parse_and_move_as_requests_are_served(tmp_path: Path) -> None:
    async def body(c: httpx.AsyncClient, key: str) -> None:
        before = scrape((await c.get("/metrics")).text)
        ok = ("meshd_requests_total", (("origin", "http"), ("outcome", "ok"), ("strategy", "meshd")))
        assert ok not in before
        for _ in range(2):
            await c.post("/v1/chat/completions", json=CHAT, headers=auth(key))
        await c.post("/v1/chat/completions", json={**CHAT, "model": "nope"}, headers=auth(key))
        r = await c.get("/metrics")
        assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
        after = scrape(r.text)
        assert after[ok] == 2
        assert after[("meshd_requests_total", (("origin", "http"), ("outcome", "no_model"),
                                               ("strategy", "meshd")))] == 1
        assert after[("meshd_generated_tokens_total", (("origin", "http"),))] == 6
        assert after[("meshd_time_to_first_token_seconds_count", (("origin", "http"),))] == 2
        assert after[("meshd_http_responses_total", (("endpoint", "/v1/chat/completions"),
                                                     ("status", "200")))] == 2
        assert after[("meshd_peers", (("state", "stalled"),))] == 1
        assert after[("meshd_gossip_rejected_total", (("reason", "replay"),))] == 1
        assert after[("meshd_attestation_failures_total", (("reason", "wrong_ca"),))] == 1
        assert after[("meshd_engine_decode_step_seconds", (("model", "tiny"),))] == 0.02
        assert after[("meshd_busy_answers_total", (("model", "tiny"), ("reason", "queue_full")))] == 2
        assert after[("meshd_cache_lookups_total", (("result", "exact"),))] == 3
        assert after[("meshd_cache_lookups_total", (("result", "refused"),))] == 1
        assert after[("meshd_cache_feedback_total", (("verdict", "wrong"),))] == 1

    run(tmp_path, FakeNode(), body)


def test_a_text_chunk_from_the_template_is_the_chunk_itself() -> None:
    from meshd.api import replies, sse

    for kind in ("chat", "completion"):
        for usage in (False, True):
            ch = replies.Chunks(kind, "r1", 1, "tiny", usage)
            for text in (" w0", 'quote " and \\ back', "new\nline", "é ü 中", "\u0000"):
                assert ch.text_event(text) == sse.event(ch.text(text))


def test_the_cache_headers_say_how_an_answer_was_served(tmp_path: Path) -> None:
    chain = FakeChain(cache_hits={
        "again": {"kind": "exact", "similarity": 1.0, "entry": 3},
        "paraphrase": {"kind": "semantic", "similarity": 0.9312, "score": 0.97, "entry": 3}})

    def ask(content: str, **extra: Any) -> dict[str, Any]:
        return {**CHAT, "messages": [{"role": "user", "content": content}], **extra}

    async def body(c: httpx.AsyncClient, key: str) -> None:
        for stream in (False, True):
            r = await c.post("/v1/chat/completions", json=ask("hello there", stream=stream),
                             headers=auth(key))
            assert r.headers["x-meshd-cache"] == "miss"
            assert "x-meshd-cache-similarity" not in r.headers
            r = await c.post("/v1/chat/completions", json=ask("again", stream=stream),
                             headers=auth(key))
            assert r.headers["x-meshd-cache"] == "exact"
            r = await c.post("/v1/chat/completions", json=ask("paraphrase", stream=stream),
                             headers=auth(key))
            assert r.headers["x-meshd-cache"] == "semantic"
            assert r.headers["x-meshd-cache-similarity"] == "0.9312"
        r = await c.post("/v1/completions", headers=auth(key),
                         json={"model": "tiny", "prompt": "x", "cache_max_error": 0.05})
        assert r.status_code == 200 and chain.requests[-1].cache_max_error == 0.05
        r = await c.post("/v1/completions", headers=auth(key),
                         json={"model": "tiny", "prompt": "x", "cache_max_error": 2})
        assert r.status_code == 400 and r.json()["error"]["param"] == "cache_max_error"

    run(tmp_path, FakeNode(chain), body)


def test_cache_feedback(tmp_path: Path) -> None:
    chain = FakeChain()

    async def body(c: httpx.AsyncClient, key: str) -> None:
        r = await c.post("/v1/chat/completions", json=CHAT, headers=auth(key))
        rid = r.headers["x-request-id"]
        r = await c.post("/v1/cache/feedback", headers=auth(key),
                         json={"request_id": f"chatcmpl-{rid}", "verdict": "wrong"})
        assert r.status_code == 200 and r.json()["removed"] == 1
        assert chain.feedback == [(rid, "wrong")]
        r = await c.post("/v1/cache/feedback", headers=auth(key),
                         json={"request_id": rid, "verdict": "right"})
        assert r.status_code == 200 and r.json()["removed"] == 0
        for bad, param in (({"request_id": rid, "verdict": "maybe"}, "verdict"),
                           ({"verdict": "wrong"}, "request_id"),
                           ({"request_id": "nope", "verdict": "wrong"}, None)):
            r = await c.post("/v1/cache/feedback", json=bad, headers=auth(key))
            assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
        r = await c.post("/v1/cache/feedback", json={"request_id": rid, "verdict": "wrong"})
        assert r.status_code == 401

    run(tmp_path, FakeNode(chain), body)
