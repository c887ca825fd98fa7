"""What the node needs from the store: ``Recorder`` on its request path, ``Reader`` on the
control socket.

``Recorder`` writes only, and none of its writes awaits: ``AsyncStore`` queues them for its
writer task, ``Store`` writes them at once (use it directly only outside trio, or in tests).
Each ``record_*`` takes exactly the arguments of the row builder of the same name in
``meshd.store.rows`` (which checks them and documents them) and hands the row to ``_put``.
``Reader`` is the two reads that ``meshd explain`` and ``meshd audit`` ask the daemon for;
``AsyncStore`` provides them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Concatenate, ParamSpec, Protocol

from meshd.store import rows
from meshd.store.rows import Row

P = ParamSpec("P")


def _recording(build: Callable[P, Row]) -> Callable[Concatenate[Recorder, P], None]:
    def record(self: Recorder, /, *args: P.args, **kwargs: P.kwargs) -> None:
        self._put(build(*args, **kwargs))

    record.__doc__ = build.__doc__
    return record


class Recorder:
    """Base of ``Store`` and ``AsyncStore``: the four writes, built by ``rows``."""

    def _put(self, row: Row) -> None:
        raise NotImplementedError

    record_event = _recording(rows.event_row)
    record_decision = _recording(rows.decision_row)
    record_outcome = _recording(rows.outcome_row)
    record_audit = _recording(rows.audit_row)


class Reader(Protocol):
    """The store's reads that the control socket answers with."""

    async def explain(self, request_id: str) -> dict[str, Any] | None:
        """Everything recorded about one request (``meshd explain``), or None."""
        ...

    async def recent_audit(self, n: int = 20, kind: str | None = None) -> list[dict[str, Any]]:
        """The newest ``n`` audit events, of ``kind`` if given (``meshd audit``)."""
        ...
