"""Streaming calls to an upstream server and what their answers mean to meshd.

``stream_events`` posts a body and yields each server-sent event's data, mapping every transport
failure and non-200 status to meshd's errors (``http_error``). On it:

- ``completion_ids``: llama-server's ``/completion`` from ids, one ``Piece`` per id returned;
- ``vllm_ids``: vLLM's ``/v1/completions`` from ids with ``return_token_ids``;
- the text mode's OpenAI routes (``meshd.upstream.model``), read with ``text_of``.

A piece's text goes with the last id of the chunk that brought it (a chunk can hold an id and no
text when the id ends in the middle of a UTF-8 character). An id outside the vocabulary is a
server that does not speak for this model: ``PeerGoneError``.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

import httpx
import trio
from httpx_sse import SSEError, aconnect_sse

from meshd.errors import BusyError, ErrorCode, PeerGoneError, RemoteError
from meshd.upstream import llamacpp
from meshd.upstream.events import event_object

DRAIN_S = 2.0


@dataclass(slots=True)
class Piece:
    token_id: int
    text: str


async def stream_events(client: httpx.AsyncClient, url: str,
                        body: dict[str, Any]) -> AsyncGenerator[str, None]:
    """Each event's data. A caller that stops early (the last chunk came, or it found garbage)
    leaves the rest to be read here, for at most ``DRAIN_S``: the server ends its answer after
    its last event, and httpx's readers must run to their end to be released cleanly."""
    where = url.rsplit("/", 1)[0]
    try:
        async with aconnect_sse(client, "POST", url, json=body) as source:
            r = source.response
            if r.status_code != 200:
                await r.aread()
                raise http_error(r, where)
            events = source.aiter_sse()
            try:
                async for sse in events:
                    yield sse.data
            finally:
                with trio.move_on_after(DRAIN_S):
                    async for _ in events:
                        pass
    except httpx.TimeoutException:
        raise PeerGoneError(f"upstream {where} timed out") from None
    except (httpx.TransportError, SSEError) as e:
        raise PeerGoneError(f"upstream {where} failed: {type(e).__name__}: {e}") from None


def _pieces(ids: tuple[int, ...] | list[int], text: str, vocab: int | None, where: str) -> list[Piece]:
    if vocab and any(i >= vocab for i in ids):
        raise PeerGoneError(f"upstream {where} returned a token id outside the vocabulary of {vocab}")
    return [Piece(i, text if k == len(ids) - 1 else "") for k, i in enumerate(ids)]


async def completion_ids(client: httpx.AsyncClient, root: str, ids: list[int], cfg: Any,
                         vocab: int | None) -> AsyncGenerator[Piece, None]:
    body = llamacpp.completion_body(ids, cfg)
    async with aclosing(stream_events(client, root + "/completion", body)) as events:
        async for data in events:
            chunk = llamacpp.parse_event(data, root)
            if chunk.text and not chunk.ids and not chunk.stop:
                raise PeerGoneError(f"upstream {root} sent text without token ids (return_tokens)")
            for p in _pieces(chunk.ids, chunk.text, vocab, root):
                yield p
            if chunk.stop:
                return
    raise PeerGoneError(f"upstream {root} ended the stream before its last chunk")


async def vllm_ids(client: httpx.AsyncClient, base_url: str, model: str, ids: list[int], cfg: Any,
                   vocab: int | None) -> AsyncGenerator[Piece, None]:
    body: dict[str, Any] = {"model": model, "prompt": list(ids), "max_tokens": int(cfg.max_tokens),
                            "stream": True, "return_token_ids": True}
    for ours, theirs in (("temperature", "temperature"), ("top_k", "top_k"), ("top_p", "top_p"),
                         ("repetition_penalty", "repetition_penalty"), ("seed", "seed")):
        v = getattr(cfg, ours, None)
        if v is not None:
            body[theirs] = v
    if getattr(cfg, "stop", ()):
        body["stop"] = list(cfg.stop)
    async with aclosing(stream_events(client, base_url + "/completions", body)) as events:
        async for data in events:
            if data.strip() == "[DONE]":
                return
            obj = event_object(data, base_url)
            choices = obj.get("choices") or []
            if not choices:
                continue  # a usage chunk
            c = choices[0] if isinstance(choices[0], dict) else {}
            got = c.get("token_ids")
            text = c.get("text") or ""
            if not isinstance(got, list) or not all(isinstance(i, int) and i >= 0 for i in got):
                raise PeerGoneError(f"upstream {base_url} streamed a chunk without token_ids")
            for p in _pieces(got, str(text), vocab, base_url):
                yield p
    raise PeerGoneError(f"upstream {base_url} ended the stream without [DONE]")


def text_of(data: str, where: str) -> str:
    """The text of one event of an OpenAI stream (chat delta or completion text)."""
    obj = event_object(data, where)
    choices = obj.get("choices") or []
    if not choices:
        return ""  # a usage chunk
    c = choices[0]
    if not isinstance(c, dict):
        raise PeerGoneError(f"upstream {where} sent an unexpected event: {data[:80]!r}")
    delta = c.get("delta")
    if isinstance(delta, dict):
        return str(delta.get("content") or "")
    return str(c.get("text") or "")


def http_error(r: httpx.Response, where: str) -> RemoteError:
    try:
        err = r.json().get("error") or {}
        msg = err.get("message") if isinstance(err, dict) else str(err)
        code = err.get("code") if isinstance(err, dict) else None
    except (ValueError, AttributeError):
        msg, code = r.text[:200], None
    text = f"upstream {where} answered {r.status_code}: {msg}"
    if r.status_code == 429:
        retry = r.headers.get("retry-after", "")
        wait_ms = float(retry) * 1000 if retry.replace(".", "", 1).isdigit() else None
        return BusyError(text, wait_ms=wait_ms)
    if r.status_code >= 500:
        return PeerGoneError(text)
    if code == "context_length_exceeded" or (
            isinstance(msg, str) and "exceeds the available context size" in msg):
        return RemoteError(text, ErrorCode.CONTEXT_LENGTH_EXCEEDED)
    if r.status_code == 404:
        return RemoteError(text, ErrorCode.NO_MODEL)
    if r.status_code in (401, 403):
        return RemoteError(f"{text} (check upstream_key_file)", ErrorCode.INTERNAL)
    return RemoteError(text, ErrorCode.MALFORMED)
