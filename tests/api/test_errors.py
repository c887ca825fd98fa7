"""meshd error codes to HTTP statuses and OpenAI error objects."""

from __future__ import annotations

import pytest

from meshd.api.errors import from_meshd
from meshd.errors import (
    BusyError,
    ContextLengthError,
    ErrorCode,
    PeerGoneError,
    ProtocolError,
    QuotaError,
    RemoteError,
    RoutingError,
    UnknownModelError,
)


@pytest.mark.parametrize(("err", "status", "code"), [
    (ProtocolError("max_tokens=0 must be an integer >= 1"), 400, None),
    (RemoteError("nope", ErrorCode.UNSUPPORTED), 400, "unsupported_parameter"),
    (ContextLengthError("too long", prompt_tokens=9, max_tokens=9, context=10), 400,
     "context_length_exceeded"),
    (RemoteError("big", ErrorCode.TOO_LARGE), 413, "request_too_large"),
    (RemoteError("who", ErrorCode.UNAUTHORIZED), 401, "invalid_api_key"),
    (UnknownModelError("no such model"), 404, "model_not_found"),
    (QuotaError("quota"), 429, "rate_limit_exceeded"),
    (BusyError("busy"), 429, "mesh_busy"),
    (RoutingError("no route"), 503, "no_route"),
    (PeerGoneError("gone"), 503, "peer_gone"),
    (RemoteError("x", ErrorCode.DEADLINE), 504, "deadline"),
    (RemoteError("x", ErrorCode.INTERNAL), 500, "internal"),
    (RemoteError("x", ErrorCode.DUPLICATE_REQUEST), 409, "duplicate_request"),
])
def test_each_code_has_its_status(err: Exception, status: int, code: str | None) -> None:
    api = from_meshd(err)  # type: ignore[arg-type]
    assert (api.status, api.code) == (status, code)
    body = api.body()["error"]
    assert set(body) == {"message", "type", "param", "code"} and body["message"] == str(err)


def test_every_error_code_maps_to_a_status() -> None:
    for code in ErrorCode:
        assert from_meshd(RemoteError("x", code)).status >= 400


def test_429_says_when_to_retry() -> None:
    assert ("retry-after", "1") in from_meshd(QuotaError("q")).headers
    assert ("retry-after", "3") in from_meshd(BusyError("b", wait_ms=2100)).headers
    assert ("retry-after", "1") in from_meshd(BusyError("b")).headers


def test_param_names_the_field_as_the_client_called_it() -> None:
    params = {"max_tokens": "max_completion_tokens", "prompt": "messages"}
    assert from_meshd(ProtocolError("max_tokens=0 must be an integer >= 1"), params=params).param \
        == "max_completion_tokens"
    assert from_meshd(ProtocolError("give either prompt or messages"), params=params).param is None
    too_long = ContextLengthError("x", prompt_tokens=1, max_tokens=1, context=1)
    assert from_meshd(too_long, params=params).param == "messages"
