"""``Recorder``: what the node needs from the store on its request path.

Writes only, and none of them awaits: ``AsyncStore`` queues them for its writer task,
``Store`` writes them at once (use it directly only outside trio, or in tests).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol


class Recorder(Protocol):
    def record_event(
        self,
        request_id: str,
        kind: str,
        *,
        node: str = ...,
        payload: Mapping[str, Any] | None = ...,
        ts: float | None = ...,
    ) -> None: ...

    def record_decision(
        self,
        request_id: str,
        *,
        strategy: str,
        candidates: Sequence[Mapping[str, Any]],
        constraints: Mapping[str, Any],
        chosen: str | None,
        order: Sequence[str],
        plan: Mapping[str, Any] | None = ...,
        ts: float | None = ...,
    ) -> None: ...

    def record_outcome(
        self,
        request_id: str,
        *,
        ttft_ms: float | None,
        tokens: int,
        tokens_per_s: float | None,
        served_by: str | None,
        route: Sequence[str],
        error: str | None = ...,
        retries: int = ...,
        hedges: int = ...,
        ts: float | None = ...,
    ) -> None: ...

    def record_audit(
        self,
        kind: str,
        *,
        peer_id: str,
        reason: str,
        detail: Mapping[str, Any] | None = ...,
        ts: float | None = ...,
    ) -> None: ...
