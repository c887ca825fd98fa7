"""Ollama's endpoints on a fake node (meshd.testing.fake_entry), through the official ``ollama``
client (its async client, on this test's trio loop) and raw HTTP: shapes, NDJSON framing, the
entry path, error shapes, cancellation. Real daemons: tests/api/test_ollama_live.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import ollama
import pytest
import trio

from meshd import __version__
from meshd.testing.fake_entry import FakeChain, FakeModel, FakeNode

from . import helpers

TINY = FakeModel("tiny", served_by="n2", route=("n2",), facts={
    "architecture": "llama", "parameters": 1_234_567, "format": "int4", "size_bytes": 4096,
    "digest": "ab" * 32, "layers": 4, "hidden_size": 32, "chat_template": "{{ messages }}"})
USER = [{"role": "user", "content": "hello there"}]


def auth(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


_clients: list[ollama.AsyncClient] = []


def client(c: httpx.AsyncClient, key: str | None) -> ollama.AsyncClient:
    """The official client for the server ``c`` talks to (closed when the test's body ends)."""
    o = ollama.AsyncClient(host=str(c.base_url), headers=auth(key) if key else None)
    _clients.append(o)
    return o


def run(tmp: Path, node: FakeNode, body: Any, **api: Any) -> None:
    async def closing(c: httpx.AsyncClient, key: str) -> None:
        try:
            await body(c, key)
        finally:
            while _clients:
                await _clients.pop().close()  # type: ignore[no-untyped-call]

    helpers.run(tmp, node, closing, **api)


def lines(raw: str) -> list[dict[str, Any]]:
    """The objects of an NDJSON body; asserts the framing: one JSON object a line."""
    assert raw.endswith("\n")
    return [json.loads(x) for x in raw[:-1].split("\n")]


def test_models_show_and_version(tmp_path: Path) -> None:
    chain = FakeChain(models_served={"tiny": TINY, "big": FakeModel("big", nodes=3)})

    async def body(c: httpx.AsyncClient, key: str) -> None:
        o = client(c, key)
        listed = (await o.list()).models
        assert [m.model for m in listed] == ["big", "tiny"]
        tiny = listed[1]
        assert tiny.size == 4096 and tiny.digest == "ab" * 32 and tiny.modified_at is not None
        assert tiny.details is not None and tiny.details.family == "llama"
        assert tiny.details.parameter_size == "1.2M" and tiny.details.quantization_level == "int4"
        raw = (await c.get("/api/tags", headers=auth(key))).json()["models"]
        assert raw[0]["name"] == "big" and raw[0]["meshd"] == {"nodes": 3, "context_length": 256}
        shown = await o.show("tiny:latest")
        assert shown.template == "{{ messages }}" and shown.capabilities == ["completion"]
        assert shown.modelinfo is not None and shown.modelinfo["llama.context_length"] == 256
        assert shown.modelinfo["general.parameter_count"] == 1_234_567
        with pytest.raises(ollama.ResponseError) as e:
            await o.show("nope")
        assert e.value.status_code == 404 and "'nope' not found" in e.value.error
        r = await c.get("/api/version", headers=auth(key))
        assert r.json() == {"version": __version__}
        with pytest.raises(ollama.ResponseError) as e:
            await o.pull("tiny")  # models are placed with meshd's config, not the API
        assert e.value.status_code == 501 and "/api/pull is not served by meshd" in e.value.error
        r = await c.delete("/api/delete", headers=auth(key))
        assert r.status_code == 501 and set(r.json()) == {"error"}

    run(tmp_path, FakeNode(chain), body)


def test_keys_are_checked_and_errors_are_ollamas_shape(tmp_path: Path) -> None:
    async def body(c: httpx.AsyncClient, key: str) -> None:
        for headers in ({}, auth("meshd-wrong")):
            r = await c.post("/api/chat", json={"model": "tiny", "messages": USER}, headers=headers)
            assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
            assert set(r.json()) == {"error"}
        with pytest.raises(ollama.ResponseError) as e:
            await client(c, None).list()
        assert e.value.status_code == 401 and "API key" in e.value.error

    run(tmp_path, FakeNode(), body)


def test_open_access_on_loopback_needs_no_key(tmp_path: Path) -> None:
    node = FakeNode()

    async def body(c: httpx.AsyncClient, key: str) -> None:
        r = await client(c, None).chat(model="tiny", messages=USER, options={"num_predict": 2})
        assert r.done and node.entry.requests[-1].client == "anonymous"

    run(tmp_path, node, body, auth="none")


def test_a_chat_through_the_entry_path(tmp_path: Path) -> None:
    chain = FakeChain(models_served={"tiny": TINY})

    async def body(c: httpx.AsyncClient, key: str) -> None:
        r = await client(c, key).chat(
            model="tiny:latest", messages=[{"role": "system", "content": "be brief"}, *USER],
            options={"temperature": 0, "top_k": 3, "top_p": 0.5, "seed": 9, "num_predict": 3,
                     "repeat_penalty": 1.0, "stop": ["zzz"], "num_ctx": 256, "num_thread": 2})
        assert r.model == "tiny:latest" and r.done and r.done_reason == "length"
        assert r.message.role == "assistant" and r.message.content == " w0 w1 w2"
        assert r.prompt_eval_count == 4 and r.eval_count == 3
        assert r.total_duration and r.prompt_eval_duration and r.eval_duration
        assert r.total_duration == r.prompt_eval_duration + r.eval_duration
        req = chain.requests[-1]
        assert req.model == "tiny" and req.client == "alice" and req.origin == "http"
        assert req.max_tokens == 3 and req.messages is not None and len(req.messages) == 2
        s = req.sampling
        assert (s.temperature, s.top_k, s.top_p, s.seed, s.repetition_penalty, s.stop) == (
            0, 3, 0.5, 9, 1.0, ("zzz",))
        raw = await c.post("/api/chat", headers=auth(key), json={
            "model": "tiny", "messages": USER, "stream": False, "options": {"num_predict": 1}})
        assert raw.headers["x-request-id"] == chain.requests[-1].request_id
        assert raw.headers["x-meshd-served-by"] == "n2" and raw.headers["x-meshd-route"] == "n2"
        assert raw.headers["content-type"] == "application/json"

    run(tmp_path, FakeNode(chain), body)


def test_streams_are_ndjson(tmp_path: Path) -> None:
    chain = FakeChain(models_served={"tiny": TINY})

    async def body(c: httpx.AsyncClient, key: str) -> None:
        o = client(c, key)
        parts = [p async for p in await o.chat(model="tiny", messages=USER, stream=True,
                                               options={"num_predict": 3})]
        assert [p.message.content for p in parts] == [" w0", " w1", " w2", ""]
        assert [p.done for p in parts] == [False, False, False, True]
        assert parts[-1].done_reason == "length" and parts[-1].eval_count == 3
        gen = [p async for p in await o.generate(model="tiny", prompt="once upon",
                                                 stream=True, options={"num_predict": 2})]
        assert "".join(p.response or "" for p in gen) == " w0 w1" and gen[-1].done
        assert chain.requests[-1].chat and chain.requests[-1].prompt == "once upon"
        r = await c.post("/api/generate", headers=auth(key),  # stream: Ollama's default
                         json={"model": "tiny", "prompt": "x", "options": {"num_predict": 2}})
        assert r.headers["content-type"] == "application/x-ndjson"
        assert r.headers["x-meshd-served-by"] == "n2" and "x-request-id" in r.headers
        objs = lines(r.text)
        assert [o.get("response") for o in objs] == [" w0", " w1", ""]
        assert objs[-1]["done"] is True and objs[-1]["prompt_eval_count"] == 1
        assert all(o["model"] == "tiny" and o["created_at"].endswith("Z") for o in objs)
        plain = await o.generate(model="tiny", prompt="x", raw=True, options={"num_predict": 2})
        assert plain.response == " w0 w1" and not chain.requests[-1].chat

    run(tmp_path, FakeNode(chain), body)


def test_a_request_without_a_prompt_loads_the_model(tmp_path: Path) -> None:
    chain = FakeChain(models_served={"tiny": TINY})

    async def body(c: httpx.AsyncClient, key: str) -> None:
        r = await client(c, key).generate(model="tiny")
        assert r.done and r.done_reason == "load" and r.response == ""
        r2 = await client(c, key).chat(model="tiny:latest", messages=[])
        assert r2.done_reason == "load"
        with pytest.raises(ollama.ResponseError) as e:
            await client(c, key).generate(model="nope")
        assert e.value.status_code == 404
        assert chain.requests == []  # nothing went into the mesh

    run(tmp_path, FakeNode(chain), body)


def test_errors_have_the_statuses_of_the_openai_api(tmp_path: Path) -> None:
    chain = FakeChain(models_served={"tiny": FakeModel("tiny", context_length=8)},
                      quotas={"alice": 0})

    async def body(c: httpx.AsyncClient, key: str) -> None:
        o = client(c, key)

        async def refused(status: int, **kw: Any) -> str:
            with pytest.raises(ollama.ResponseError) as e:
                await o.chat(**{"model": "tiny", "messages": USER, **kw})
            assert e.value.status_code == status, e.value.error
            return str(e.value.error)

        assert "no node of the mesh serves model 'nope'" in await refused(404, model="nope")
        assert "context of 8" in await refused(400, options={"num_predict": 100})
        assert (await refused(400, format="json")).startswith("format: structured output")
        assert (await refused(400, options={"num_ctx": 4096})).startswith(
            "options.num_ctx: 4096 is more than model tiny's context of 8 tokens")
        assert "images" in await refused(400, messages=[{"role": "user", "content": "x",
                                                         "images": [b"\x89PNG"]}])
        r = await c.post("/api/chat", headers=auth(key),
                         json={"model": "tiny", "messages": USER, "stream": False,
                               "options": {"num_predict": 1}})
        assert r.status_code == 429 and r.headers["retry-after"] == "1"
        assert set(r.json()) == {"error"} and "quota" in r.json()["error"]
        chain.quotas.clear()
        chain.no_route = True
        await refused(503, options={"num_predict": 1})
        r = await c.post("/api/generate", headers=auth(key), content=b"{not json")
        assert r.status_code == 400 and "JSON" in r.json()["error"]
        r = await c.get("/api/chat", headers=auth(key))
        assert r.status_code == 405 and r.headers["allow"] == "POST"

    run(tmp_path, FakeNode(chain), body)


def test_a_failure_after_the_stream_started_is_an_error_line(tmp_path: Path) -> None:
    chain = FakeChain(fail_after_tokens=1)

    async def body(c: httpx.AsyncClient, key: str) -> None:
        r = await c.post("/api/chat", headers=auth(key),
                         json={"model": "tiny", "messages": USER, "options": {"num_predict": 5}})
        assert r.status_code == 200
        objs = lines(r.text)
        assert objs[0]["message"]["content"] == " w0"
        # the official client raises ResponseError on a line with "error"
        assert set(objs[-1]) == {"error"} and "went away" in objs[-1]["error"]

    run(tmp_path, FakeNode(chain), body)


def test_embed_is_the_nodes_embedding_model(tmp_path: Path) -> None:
    async def body(c: httpx.AsyncClient, key: str) -> None:
        o = client(c, key)
        r = await o.embed(model="fake-embed", input=["one", "two words"])
        assert len(r.embeddings) == 2 and len(r.embeddings[0]) == 4
        assert r.prompt_eval_count == 3 and r.total_duration and r.model == "fake-embed"
        single = await o.embed(model="fake-embed:latest", input="one")
        assert single.embeddings[0] == r.embeddings[0]
        legacy = await o.embeddings(model="fake-embed", prompt="one")
        assert list(legacy.embedding) == r.embeddings[0]
        with pytest.raises(ollama.ResponseError) as e:
            await o.embed(model="nomic-embed-text", input="one")
        assert e.value.status_code == 404 and "'fake-embed'" in e.value.error
        with pytest.raises(ollama.ResponseError) as e:
            await o.embed(model="fake-embed", input="one", dimensions=2)
        assert e.value.status_code == 400 and e.value.error.startswith("dimensions:")

    run(tmp_path, FakeNode(), body)


def test_a_client_that_goes_away_mid_stream_cancels_the_request(tmp_path: Path) -> None:
    chain = FakeChain(step_s=0.05)

    async def body(c: httpx.AsyncClient, key: str) -> None:
        req = json.dumps({"model": "tiny", "messages": USER, "options": {"num_predict": 200}})
        host, port = str(c.base_url.host), int(c.base_url.port or 80)
        stream = await trio.open_tcp_stream(host, port)
        await stream.send_all(
            b"POST /api/chat HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            + f"authorization: Bearer {key}\r\ncontent-length: {len(req)}\r\n\r\n".encode()
            + req.encode())
        got = b""
        while got.count(b'"content":" w') < 2:
            got += await stream.receive_some(65536)
        await stream.aclose()
        with trio.fail_after(5):
            while chain.active:
                await trio.sleep(0.01)
        assert chain.cancelled == 1 and chain.in_flight["alice"] == 0

    run(tmp_path, FakeNode(chain), body)
