"""An API server on a fake node, in the test's own trio run, and an HTTP client for it; a
grammar's verdict on a text."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import trio

from meshd.api.auth import add_key
from meshd.api.server import serve_api
from meshd.config import parse_config
from meshd.testing.fake_entry import FakeNode


@asynccontextmanager
async def api_server(tmp: Path, node: FakeNode, **api: Any) -> AsyncIterator[tuple[str, str]]:
    """Serve ``node`` on a free loopback port; yields (base URL, a valid key of client 'alice')."""
    key = add_key(tmp / "api-keys", "alice")
    cfg = parse_config({"api": {"listen": "127.0.0.1:0", "keys_file": "api-keys", **api}},
                       base_dir=str(tmp))
    async with trio.open_nursery() as nursery:
        url = await nursery.start(serve_api, node, cfg)
        yield url, key
        nursery.cancel_scope.cancel()


def run(tmp: Path, node: FakeNode, body: Callable[[httpx.AsyncClient, str], Awaitable[None]],
        **api: Any) -> None:
    """Run ``body(client, key)`` against a server of ``node``; the client's base URL is the
    server's root (not /v1)."""

    async def main() -> None:
        async with api_server(tmp, node, **api) as (url, key):
            root = url.removesuffix("/v1")
            async with httpx.AsyncClient(base_url=root, timeout=10) as client:
                await body(client, key)

    trio.run(main)


def stream_and_answer(tmp: Path, template: str, pieces: tuple[str, ...], request: dict[str, Any]
                      ) -> tuple[dict[str, str], list[dict[str, Any]], dict[str, Any]]:
    """Send chat ``request`` (its ``model`` is served) streamed, then not, to a fake node whose
    model carries chat ``template`` and answers ``pieces`` (one per token): the stream's
    headers, each choice's delta (with its ``finish_reason``) and the answer not streamed."""
    from meshd.testing.fake_entry import FakeChain, FakeModel

    model = FakeModel(request["model"], context_length=4096, facts={"chat_template": template},
                      reply=pieces)
    node = FakeNode(FakeChain(models_served={model.name: model}))
    deltas: list[dict[str, Any]] = []
    got: dict[str, Any] = {}

    async def body(c: httpx.AsyncClient, key: str) -> None:
        auth = {"authorization": f"Bearer {key}"}
        async with c.stream("POST", "/v1/chat/completions", json={**request, "stream": True},
                            headers=auth) as r:
            got["headers"] = dict(r.headers)
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    deltas.extend({**ch["delta"], "finish_reason": ch["finish_reason"]}
                                  for ch in json.loads(line[6:])["choices"])
        got["answer"] = (await c.post("/v1/chat/completions", json=request, headers=auth)).json()

    run(tmp, node, body)
    return got["headers"], deltas, got["answer"]


def grammar_accepts(grammar: str, text: str, tok: Any) -> bool:
    """Whether ``grammar`` accepts ``text`` whole, token by token of ``tok``."""
    from meshd.engine.constrain import Matcher

    m = Matcher(tok, grammar)
    ids = tok.encode(text, add_special_tokens=False)
    return all(m.consume(t) for t in ids) and bool(m.inner.is_accepting())
