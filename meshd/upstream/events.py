"""One server-sent event of an upstream's stream, as a JSON object. Pure: no I/O.

Both stream shapes meshd reads from an upstream (llama-server's native ``/completion`` and the
OpenAI routes) carry one JSON object per ``data:`` line and report a failure as
``{"error": ...}``; anything else cuts the upstream off as a dead peer would be (the node fails
over).
"""

from __future__ import annotations

import json
from typing import Any

from meshd.errors import PeerGoneError


def event_object(data: str, where: str) -> dict[str, Any]:
    """The JSON object of one ``data:`` payload from upstream ``where``; ``PeerGoneError`` for
    what is not JSON, not an object, or an error event."""
    try:
        obj = json.loads(data)
    except ValueError:
        raise PeerGoneError(f"upstream {where} sent an event that is not JSON: {data[:80]!r}") from None
    if not isinstance(obj, dict):
        raise PeerGoneError(f"upstream {where} sent an unexpected event: {data[:80]!r}")
    if obj.get("error"):
        err = obj["error"]
        msg = err.get("message") if isinstance(err, dict) else str(err)
        raise PeerGoneError(f"upstream {where} failed mid-answer: {msg}")
    return obj
