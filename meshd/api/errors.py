"""meshd's error codes as HTTP statuses and OpenAI error objects. Pure: no I/O.

OpenAI answers every error with ``{"error": {"message", "type", "param", "code"}}``; clients
(the ``openai`` package among them) raise by status: 400 ``BadRequestError``, 401
``AuthenticationError``, 404 ``NotFoundError``, 429 ``RateLimitError``, 5xx ``InternalServerError``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from meshd.errors import BusyError, ContextLengthError, ErrorCode, MeshdError, RoutingError

# ErrorCode -> (HTTP status, OpenAI error type, OpenAI error code)
_STATUS: dict[str, tuple[int, str, str | None]] = {
    ErrorCode.MALFORMED: (400, "invalid_request_error", None),
    ErrorCode.UNSUPPORTED: (400, "invalid_request_error", "unsupported_parameter"),
    ErrorCode.CONTEXT_LENGTH_EXCEEDED: (400, "invalid_request_error", "context_length_exceeded"),
    ErrorCode.TOO_LARGE: (413, "invalid_request_error", "request_too_large"),
    ErrorCode.UNAUTHORIZED: (401, "invalid_request_error", "invalid_api_key"),
    ErrorCode.UNATTESTED: (403, "invalid_request_error", "unattested"),
    ErrorCode.NO_MODEL: (404, "invalid_request_error", "model_not_found"),
    ErrorCode.NO_COLLECTION: (404, "invalid_request_error", "collection_not_found"),
    ErrorCode.DUPLICATE_REQUEST: (409, "invalid_request_error", "duplicate_request"),
    ErrorCode.QUOTA: (429, "requests", "rate_limit_exceeded"),
    ErrorCode.BUSY: (429, "requests", "mesh_busy"),
    ErrorCode.NO_ROUTE: (503, "server_error", "no_route"),
    ErrorCode.PEER_GONE: (503, "server_error", "peer_gone"),
    ErrorCode.NO_SESSION: (503, "server_error", "no_session"),
    ErrorCode.DEADLINE: (504, "server_error", "deadline"),
    ErrorCode.HOPS: (502, "server_error", "hops"),
    ErrorCode.BAD_TENSOR: (502, "server_error", "bad_tensor"),
    ErrorCode.CANCELLED: (499, "server_error", "cancelled"),
    ErrorCode.INTERNAL: (500, "server_error", "internal"),
}
RETRY_AFTER_S = 1  # what a quota answer tells the client to wait (a request must end first)
_FIELD = re.compile(r"^([a-z_]+(?:\[\d+\])?)\b")


@dataclass
class ApiError(Exception):
    """An HTTP error answer in OpenAI's shape."""

    status: int
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None
    headers: list[tuple[str, str]] = field(default_factory=list)

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}

    def __str__(self) -> str:
        return f"{self.status} {self.message}"


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


def unsupported(param: str, why: str) -> ApiError:
    return ApiError(400, f"{param}: {why}", param=param, code="unsupported_parameter")


def from_meshd(err: MeshdError, *, params: dict[str, str] | None = None) -> ApiError:
    """The HTTP answer for an error of the entry chain. ``params`` maps SUBMIT field names to
    the request's own (``prompt`` to ``messages`` for a chat, ``max_tokens`` to itself) so
    ``param`` names the field the client sent; a message that starts with no such name gets no
    ``param``."""
    code = str(getattr(err, "code", ErrorCode.INTERNAL))
    if isinstance(err, RoutingError):
        code = str(err.code)
    status, kind, oa_code = _STATUS.get(code, (500, "server_error", code))
    message = str(err) or code
    param = None
    m = _FIELD.match(message)
    if m is not None and status == 400:
        name = m.group(1)
        base = name.split("[", 1)[0]
        if base in (params or {}):
            param = (params or {})[base] + name[len(base):]
    headers: list[tuple[str, str]] = []
    if isinstance(err, ContextLengthError):
        param = (params or {}).get("prompt", "prompt")
    if status == 429:
        wait_ms = getattr(err, "wait_ms", None) if isinstance(err, BusyError) else None
        wait_s = max(1, math.ceil(wait_ms / 1000.0)) if wait_ms else RETRY_AFTER_S
        headers.append(("retry-after", str(wait_s)))
    return ApiError(status, message, kind, param, oa_code, headers)


def status_of(code: str) -> int:
    return _STATUS.get(code, (500, "", None))[0]
