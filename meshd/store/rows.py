"""Rows of the store, built and checked before any I/O.

Each ``*_row`` function validates its arguments (a wrong event kind is our misuse and raises
``StoreError`` at the call site, not later in the writer), stamps the time when none is given,
and turns structured values into JSON text *now*, so a caller that mutates its dict afterwards
cannot change what gets written. JSON is strict: non-finite floats become null, sets become
sorted lists, bytes become hex, dataclasses become maps, anything else its ``str``.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from meshd.core import audit as audit_kinds
from meshd.errors import LocalError

# The lifecycle of one request, in the order they usually happen. ``cancelled``: the client
# went away; ``clamped`` and ``tokenizer_unavailable`` come before ``received``. See ``meshd.store.explain`` for the payload keys that the explanation reads.
EVENT_KINDS = frozenset(
    {
        "received",
        "tier",  # model = "auto": the tier decision (docs/tiers.md)
        "routed",
        "forwarded",
        "first_token",
        "retry",
        "back_to_refuser",
        "hedge",
        "replan",
        "done",
        "failed",
        "cancelled",
        "clamped",  # max_tokens cut to meshd's limit (entry node, prepare)
        "tokenizer_unavailable",  # the entry node forwarded text: no tokenizer in time, and why
        "cache_hit",
        "cache_skip",
        "cache_overtook",  # a semantic hit came while a model ran: cancelled or its answer dropped
    }
)

# Common audit kinds (the column is free text so that new kinds need no migration); every kind
# is in meshd.core.audit.
AUDIT_ATTESTATION_FAILED = audit_kinds.ATTESTATION_FAILED
AUDIT_REVOKED = audit_kinds.REVOKED
AUDIT_ADVERT_REJECTED = audit_kinds.ADVERT_REJECTED


class StoreError(LocalError):
    """The store cannot be opened or used as asked (bad path, newer schema, bad argument)."""


class Row(NamedTuple):
    """One write: ``replace`` rows overwrite the row with the same primary key."""

    table: str
    values: dict[str, Any]
    replace: bool = False


def plain(value: Any) -> Any:
    """``value`` as plain JSON types (see the module docstring)."""
    if value is None or isinstance(value, str | bool | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, enum.Enum):
        return plain(value.value)
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, set | frozenset):
        return sorted((plain(v) for v in value), key=repr)
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return plain({f.name: getattr(value, f.name) for f in dataclasses.fields(value)})
    return str(value)


def to_json(value: Any) -> str:
    return json.dumps(plain(value), separators=(",", ":"), sort_keys=True, allow_nan=False)


def from_json(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def _now(ts: float | None) -> float:
    return time.time() if ts is None else float(ts)


def _request_id(request_id: str) -> str:
    if not isinstance(request_id, str) or not request_id:
        raise StoreError("request_id must be a non-empty string")
    return request_id


def _opt_float(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else float(value)


def event_row(
    request_id: str,
    kind: str,
    *,
    node: str = "",
    payload: Mapping[str, Any] | None = None,
    ts: float | None = None,
) -> Row:
    """Journal one lifecycle event of a request (``kind`` in ``EVENT_KINDS``)."""
    if kind not in EVENT_KINDS:
        raise StoreError(f"unknown request event kind {kind!r}; known: {sorted(EVENT_KINDS)}")
    return Row(
        "journal",
        {
            "ts": _now(ts),
            "request_id": _request_id(request_id),
            "kind": kind,
            "node": node,
            "payload": to_json(payload or {}),
        },
    )


def decision_row(
    request_id: str,
    *,
    strategy: str,
    candidates: Sequence[Mapping[str, Any]],
    constraints: Mapping[str, Any],
    chosen: str | None,
    order: Sequence[str],
    plan: Mapping[str, Any] | None = None,
    ts: float | None = None,
) -> Row:
    """The routing decision of a request; a later one (a replan) replaces it."""
    return Row(
        "decisions",
        {
            "request_id": _request_id(request_id),
            "ts": _now(ts),
            "strategy": strategy,
            "candidates": to_json(list(candidates)),
            "constraints": to_json(constraints),
            "chosen": chosen,
            "order": to_json(list(order)),
            "plan": None if plan is None else to_json(plan),
        },
        replace=True,
    )


def outcome_row(
    request_id: str,
    *,
    ttft_ms: float | None,
    tokens: int,
    tokens_per_s: float | None,
    served_by: str | None,
    route: Sequence[str],
    error: str | None = None,
    retries: int = 0,
    hedges: int = 0,
    ts: float | None = None,
) -> Row:
    """How a request ended (one per request; a later one replaces it)."""
    return Row(
        "outcomes",
        {
            "request_id": _request_id(request_id),
            "ts": _now(ts),
            "ttft_ms": _opt_float(ttft_ms),
            "tokens": int(tokens),
            "tokens_per_s": _opt_float(tokens_per_s),
            "served_by": served_by,
            "route": to_json(list(route)),
            "error": error,
            "retries": int(retries),
            "hedges": int(hedges),
        },
        replace=True,
    )


def audit_row(
    kind: str,
    *,
    peer_id: str,
    reason: str,
    detail: Mapping[str, Any] | None = None,
    ts: float | None = None,
) -> Row:
    """A security event (``AUDIT_*`` kinds, or any other short word)."""
    if not isinstance(kind, str) or not kind:
        raise StoreError("audit kind must be a non-empty string")
    return Row(
        "audit",
        {
            "ts": _now(ts),
            "kind": kind,
            "peer_id": peer_id,
            "reason": reason,
            "detail": to_json(detail or {}),
        },
    )
