"""A model served by forwarding to an OpenAI-compatible server (``[[models]] upstream = URL``).

``UpstreamModel`` is what the runner needs of a model (``meshd.node.runner.ModelLike``): it
"tokenizes" with ``meshd.upstream.codec`` and generates by streaming from the upstream's
``/completions`` (text prompts) or ``/chat/completions`` (chat messages), one token event per
piece of text the upstream sends. The runner queues, caps and times it like a local model, so the
node's adverts carry the upstream's measured time to first token, decode rate and requests in
flight, and routers predict it like any other node.

HTTP is httpx (with httpx-sse for the event stream) on trio. Failures map to meshd's errors so the
entry node fails over exactly as for a dead peer: unreachable, reset, timed out or a 5xx is
``PeerGoneError``; 429 is ``BusyError`` (with the upstream's ``retry-after``); a 4xx is a
``RemoteError`` whose code says why (the request itself was refused).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import trio
from httpx_sse import SSEError, aconnect_sse

from meshd.errors import BusyError, ErrorCode, LocalError, PeerGoneError, RemoteError
from meshd.upstream import codec

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Piece:
    token_id: int
    text: str


class UpstreamModel:
    num_layers = 1
    hidden_size = 0

    def __init__(self, base_url: str, model: str, *, api_key: str | None = None,
                 timeout_s: float = 30.0, context_length: int = 0) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key = api_key
        self.timeout_s = timeout_s
        self.context_length = context_length or None
        self._client: httpx.AsyncClient | None = None
        self.stats: dict[str, Any] = {"requests": 0, "errors": 0, "in_flight": 0,
                                      "errors_by_kind": {}, "last_error": None}

    @classmethod
    def from_config(cls, m: Any, key_path: Path | None) -> UpstreamModel:
        key = None
        if key_path is not None:
            try:
                key = key_path.read_text().strip()
            except OSError as e:
                raise LocalError(f"cannot read upstream_key_file {key_path}: {e.strerror}") from None
        return cls(m.upstream, m.upstream_model, api_key=key, timeout_s=m.upstream_timeout_s,
                   context_length=m.context_length)

    # ------------------------------------------------------------------ tokenizing

    def encode_prompt(self, text: str, *, chat: bool = False) -> list[int]:
        if chat:
            return codec.encode_chat([{"role": "user", "content": text}])
        return codec.encode_text(text)

    def encode_messages(self, messages: list[Any]) -> list[int]:
        return codec.encode_chat(list(messages))

    # ------------------------------------------------------------------ generating

    def statistics(self) -> dict[str, Any]:
        return {"upstream": self.base_url, "upstream_model": self.model, **self.stats,
                "errors_by_kind": dict(self.stats["errors_by_kind"])}

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            headers = {"authorization": f"Bearer {self.api_key}"} if self.api_key else {}
            self._client = httpx.AsyncClient(
                headers=headers, timeout=httpx.Timeout(self.timeout_s, connect=min(self.timeout_s, 5.0)))
        return self._client

    def request_body(self, ids: list[int], cfg: Any) -> tuple[str, dict[str, Any]]:
        """(path, JSON body) of the upstream call for prompt ``ids`` (with any text already
        generated, for a resumed request) and the generation config."""
        try:
            d = codec.decode(ids)
        except codec.CodecError as e:
            raise RemoteError(f"upstream model {self.model}: {e}", ErrorCode.MALFORMED) from None
        body: dict[str, Any] = {"model": self.model, "stream": True,
                                "max_tokens": int(cfg.max_tokens)}
        for key in ("temperature", "top_p", "seed"):
            v = getattr(cfg, key, None)
            if v is not None:
                body[key] = v
        if getattr(cfg, "stop", ()):
            body["stop"] = list(cfg.stop)
        if d.kind == codec.CHAT:
            messages = d.messages()
            if d.generated:  # a resumed answer: the upstream continues the assistant's turn
                messages.append({"role": "assistant", "content": d.generated})
            body["messages"] = messages
            return "/chat/completions", body
        body["prompt"] = d.prompt + d.generated
        return "/completions", body

    async def generate(self, ids: list[int], cfg: Any) -> AsyncIterator[Piece]:
        path, body = self.request_body(ids, cfg)
        self.stats["requests"] += 1
        self.stats["in_flight"] += 1
        t0 = time.perf_counter()
        try:
            with trio.fail_after(self.timeout_s * 4 + float(cfg.max_tokens)):  # a stuck stream
                async for text in self._stream(path, body):
                    for pid, part in codec.piece_ids(text):
                        yield Piece(pid, part)
        except (RemoteError, trio.TooSlowError) as e:
            err = e if isinstance(e, RemoteError) else PeerGoneError(
                f"upstream {self.base_url} stalled mid-answer")
            self._failed(err)
            raise err from None
        finally:
            self.stats["in_flight"] -= 1
            log.debug("upstream call done model=%s ms=%.1f", self.model,
                      (time.perf_counter() - t0) * 1000)

    def _failed(self, err: RemoteError) -> None:
        kind = str(err.code)
        self.stats["errors"] += 1
        self.stats["errors_by_kind"][kind] = self.stats["errors_by_kind"].get(kind, 0) + 1
        self.stats["last_error"] = str(err)[:300]
        log.warning("upstream failed url=%s model=%s code=%s error=%s", self.base_url, self.model,
                    kind, err)

    async def _stream(self, path: str, body: dict[str, Any]) -> AsyncIterator[str]:
        url = self.base_url + path
        try:
            async with aconnect_sse(self._http(), "POST", url, json=body) as source:
                r = source.response
                if r.status_code != 200:
                    await r.aread()
                    raise _http_error(r, self.base_url)
                async for sse in source.aiter_sse():
                    if sse.data.strip() == "[DONE]":
                        return
                    text = _text_of(sse.data, self.base_url)
                    if text:
                        yield text
        except httpx.TimeoutException:
            raise PeerGoneError(f"upstream {self.base_url} timed out") from None
        except (httpx.TransportError, SSEError) as e:
            raise PeerGoneError(f"upstream {self.base_url} failed: {type(e).__name__}: {e}") from None
        raise PeerGoneError(f"upstream {self.base_url} ended the stream without [DONE]")


def _text_of(data: str, where: str) -> str:
    try:
        obj = json.loads(data)
    except ValueError:
        raise PeerGoneError(f"upstream {where} sent an event that is not JSON") from None
    if not isinstance(obj, dict):
        raise PeerGoneError(f"upstream {where} sent an unexpected event")
    if obj.get("error"):
        err = obj["error"]
        msg = err.get("message") if isinstance(err, dict) else str(err)
        raise PeerGoneError(f"upstream {where} failed mid-answer: {msg}")
    choices = obj.get("choices") or []
    if not choices:
        return ""  # a usage chunk
    c = choices[0]
    delta = c.get("delta")
    if isinstance(delta, dict):
        return str(delta.get("content") or "")
    return str(c.get("text") or "")


def _http_error(r: httpx.Response, where: str) -> RemoteError:
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
    if code == "context_length_exceeded":
        return RemoteError(text, ErrorCode.CONTEXT_LENGTH_EXCEEDED)
    if r.status_code == 404:
        return RemoteError(text, ErrorCode.NO_MODEL)
    if r.status_code in (401, 403):
        return RemoteError(f"{text} (check upstream_key_file)", ErrorCode.INTERNAL)
    return RemoteError(text, ErrorCode.MALFORMED)
