"""Server-sent events as OpenAI streams them: ``data: <json>`` events, ``data: [DONE]`` last.

No server-side SSE library fits a bare ASGI app (sse-starlette needs Starlette), and what OpenAI
sends is the smallest part of the format (https://html.spec.whatwg.org/#server-sent-events):
one ``data:`` field per event, the JSON on one line (``json.dumps`` escapes every newline),
ended by a blank line. The tests read these events back with the ``openai`` client's own SSE
decoder and with raw HTTP.
"""

from __future__ import annotations

import json
from typing import Any

CONTENT_TYPE = b"text/event-stream; charset=utf-8"
DONE = b"data: [DONE]\n\n"


def event(obj: Any) -> bytes:
    """One event carrying ``obj`` as JSON (compact; never a raw newline inside)."""
    return b"data: " + json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"


def comment(text: str) -> bytes:
    """A comment line: clients ignore it; a proxy sees the stream alive."""
    return b": " + text.replace("\n", " ").replace("\r", " ").encode() + b"\n\n"
