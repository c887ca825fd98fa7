"""What the HTTP API needs from a node: its entry chain, readiness and status.

``ApiNode`` is what the app's handlers read, ``TelemetrySource`` what ``/metrics`` reads, and
``ServedNode`` both: the node that ``serve_api`` serves.

``meshd.node`` provides them on the daemon; ``meshd.testing.fake_entry`` is the fake beside them
for the API's unit tests.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from meshd.core.request import EntryRequest

# ("route", {"served_by": str, "route": [names]}) once before the first tokens and again after a
# failover; ("tokens", {"ids": [int], "text": str}) as tokens come
Emit = Callable[[str, dict[str, Any]], Awaitable[None]]
# called once at the end of every request with its final stats, "outcome" ("ok" or the error
# code), "origin" ("control" or "http"), and what the cache lookup and the tier step decided
# ("cache_lookup", "tier": meshd.node.entry.record.decisions)
Observer = Callable[[dict[str, Any]], None]


class EntryChain(Protocol):
    """The one way into the mesh: `meshd submit` and the HTTP API both submit through it."""

    @property
    def observers(self) -> list[Observer]: ...

    async def submit(self, req: EntryRequest, emit: Emit) -> dict[str, Any]:
        """Route and serve ``req``, calling ``emit`` as it goes; returns the final stats
        (request_id, text, token_ids, model, strategy, served_by, route, ttft_ms, tokens,
        prompt_tokens, completion_tokens, finish_reason, cached). Raises ``MeshdError`` with a
        ``code``. Cancelling the caller cancels the request across the mesh."""
        ...

    def models(self) -> list[dict[str, Any]]:
        """Every model the mesh serves (gossiped view): {"id", "nodes", "context_length"}, and
        what else is known of it (``meshd.node.model_facts``; each key only when known: format,
        architecture, parameters, size_bytes, digest, layers, hidden_size, chat_template)."""
        ...

    def new_request_id(self) -> str: ...

    async def chat_template(self, model: str) -> str | None:
        """The chat template this node renders ``model``'s chat messages with, None when it
        knows none (meshd.api.tool_template reads its tool syntax)."""
        ...

    async def embed(self, texts: list[str]) -> tuple[str, list[list[float]], int]:
        """Sentence embeddings of ``texts`` with this node's model: (model name, L2-normalised
        vectors, tokens read). Raises ``MeshdError`` (``unsupported``) when it has none."""
        ...

    async def cache_feedback(self, rid: str, verdict: str) -> dict[str, Any]:
        """The answer of request ``rid`` was ``right`` or ``wrong`` (docs/cache.md): a wrong
        one's cache entry is removed. Raises ``MeshdError`` (``malformed``) for a request the
        cache does not know."""
        ...


class ApiNode(Protocol):
    """The node as the API sees it."""

    @property
    def entry(self) -> EntryChain: ...

    def ready_state(self) -> tuple[bool, str]:
        """(True, why) when running with peers or a local model; else (False, why)."""
        ...

    def status(self) -> dict[str, Any]: ...


class TelemetrySource(Protocol):
    """What the metrics collector reads at scrape time."""

    def status(self) -> dict[str, Any]: ...

    def peers_listing(self) -> list[dict[str, Any]]: ...


class ServedNode(ApiNode, TelemetrySource, Protocol):
    """The node that ``meshd.api.server.serve_api`` serves: its handlers' view and its metrics'."""
