"""What the web console reads of its node: ``ConsoleSource``, a narrow edge with a fake beside it
(``meshd.testing.fake_console``); the daemon's is ``meshd.node.console.ConsoleFacts``.

Every method is a read; nothing the console does changes the node (the playground's chat goes
through the OpenAI endpoint like any client's request).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from meshd.config import Config


@dataclass(frozen=True)
class MeshRows:
    """The mesh as this node knows it at one moment, as rows of ``meshd peers --json``:
    ``local`` is this node itself (its own advert; no RTT, no age); ``peers`` the peer table
    (stalled peers included); ``departed`` peers heard from since the daemon started that are in
    the table no more (their last advert, with ``silent_s``: seconds since it was heard);
    ``revoked`` the peer ids of those whose certificate this node knows to be revoked."""

    local: dict[str, Any]
    peers: list[dict[str, Any]] = field(default_factory=list)
    departed: list[dict[str, Any]] = field(default_factory=list)
    revoked: frozenset[str] = frozenset()


class ConsoleSource(Protocol):
    """The node as the console sees it."""

    @property
    def config(self) -> Config: ...

    def mesh(self) -> MeshRows:
        """The mesh now (cheap enough to call once per advert interval)."""
        ...

    def identity(self) -> dict[str, Any]:
        """This node's name, peer id and certificate: serial, roles, labels, not_before and
        not_after (Unix seconds), the CA's key id."""
        ...

    async def explain(self, request_id: str) -> dict[str, Any] | None:
        """The journal's record of a request that entered here, as `meshd explain --json`
        gives it; None when the journal does not have it."""
        ...

    async def audit(self, n: int) -> list[dict[str, Any]]:
        """The latest ``n`` audit events, newest first, as `meshd audit --json`."""
        ...
