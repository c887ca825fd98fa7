"""The console's list of the last requests that entered this node.

``RecentRequests.observe`` is an observer of the entry chain (like the metrics'): called once
at the end of every request, control socket or HTTP, with its final stats. ``request_row`` keeps
what the list shows; the full story (the candidates and their predicted times to first token)
stays in the journal, which the console asks for when a row is opened (`meshd explain`).
Pure: no I/O and no clock (the time comes in); the console's stream waits on ``version``.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

log = logging.getLogger(__name__)

MAX_KEPT = 200


def _num(v: Any, digits: int = 1) -> float | None:
    return round(float(v), digits) if isinstance(v, int | float) and not isinstance(v, bool) else None


def cache_word(stats: Mapping[str, Any]) -> str | None:
    """exact, semantic, miss, verify, or None (the request was not looked up)."""
    kind = stats.get("cache_lookup")
    if kind:
        return str(kind)
    if stats.get("cached"):  # an observer event from before cache_lookup was recorded
        return "hit"
    return None


def request_row(stats: Mapping[str, Any], ts: float) -> dict[str, Any]:
    """One line of the list from the entry chain's final stats of a request, ended at ``ts``."""
    route = [str(n) for n in stats.get("route") or []]
    tier = stats.get("tier") if isinstance(stats.get("tier"), Mapping) else None
    pipeline = stats.get("pipeline")
    return {
        "id": str(stats.get("request_id") or ""),
        "ts": round(ts, 3),
        "outcome": str(stats.get("outcome") or "ok"),
        "origin": stats.get("origin"),
        "client": stats.get("client"),
        "model": stats.get("model"),
        "strategy": stats.get("strategy"),
        "served_by": stats.get("served_by"),
        "route": route,
        "pipeline": bool(pipeline),
        "ttft_ms": _num(stats.get("ttft_ms")),
        "tokens": stats.get("completion_tokens", stats.get("tokens")),
        "tokens_per_s": _num(stats.get("tokens_per_s")),
        "total_ms": _num(stats.get("total_ms")),
        "retries": stats.get("retries") or 0,
        "hedges": stats.get("hedges") or 0,
        "cache": cache_word(stats),
        "tier": dict(tier) if tier is not None else None,
    }


class RecentRequests:
    """The last ``max_kept`` requests, newest last; ``version`` grows by one per request, and
    ``since(v)`` gives those recorded after version ``v``."""

    def __init__(self, clock: Callable[[], float], *, max_kept: int = MAX_KEPT) -> None:
        self.clock = clock  # wall time (Unix seconds) for the rows' ``ts``
        self.rows: deque[tuple[int, dict[str, Any]]] = deque(maxlen=max_kept)
        self.version = 0
        self.on_change: Callable[[], None] | None = None

    def observe(self, stats: Mapping[str, Any]) -> None:
        """The entry chain's observer: never raises (the console must not fail a request)."""
        try:
            row = request_row(stats, self.clock())
        except Exception:
            log.exception("console request row failed")
            return
        self.version += 1
        self.rows.append((self.version, row))
        if self.on_change is not None:
            self.on_change()

    def since(self, version: int) -> list[dict[str, Any]]:
        return [row for v, row in self.rows if v > version]

    def get(self, request_id: str) -> dict[str, Any] | None:
        return next((row for _, row in reversed(self.rows) if row["id"] == request_id), None)
