"""An API server on a fake node, in the test's own trio run, and an HTTP client for it."""

from __future__ import annotations

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
