"""The HTTP API as a bare ASGI app (no framework): OpenAI's endpoints, health, metrics.

Routes: ``GET /healthz``, ``GET /readyz``, ``GET /metrics`` (no key needed), ``GET /v1/models``,
``POST /v1/chat/completions``, ``POST /v1/completions``, ``POST /v1/embeddings``,
``POST /v1/cache/feedback`` (a bearer key, unless ``auth = "none"``).
A generation request becomes an ``EntryRequest`` through ``parse_submit`` and goes to
``node.entry.submit``, the same entry path as `meshd submit`; a client that goes away cancels it.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from meshd.api import replies, sse
from meshd.api.auth import KeyFile, bearer_token
from meshd.api.errors import ApiError, from_meshd
from meshd.api.metrics import CONTENT_TYPE as METRICS_TYPE
from meshd.api.metrics import Metrics
from meshd.api.protocols import ApiNode
from meshd.api.shapes import ApiCall, chat_call, completion_call, wants_template
from meshd.core.request import EntryRequest, parse_submit
from meshd.errors import ErrorCode, MeshdError

log = logging.getLogger(__name__)

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
JSON_TYPE = b"application/json"


def _json(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


class ApiApp:
    def __init__(self, node: ApiNode, keys: KeyFile, metrics: Metrics, *,
                 max_body_bytes: int = 2_097_152) -> None:
        self.node = node
        self.keys = keys
        self.metrics = metrics
        self.max_body_bytes = max_body_bytes
        # PREFIX -> an ASGI app answering PREFIX and everything under it (the console at /ui)
        self.mounts: dict[str, Callable[[Scope, Receive, Send], Awaitable[None]]] = {}
        self.started = int(time.time())
        self.routes: dict[tuple[str, str], Callable[[Scope, Receive, Send], Awaitable[int]]] = {
            ("GET", "/healthz"): self.healthz,
            ("GET", "/readyz"): self.readyz,
            ("GET", "/metrics"): self.prometheus,
            ("GET", "/v1/models"): self.list_models,
            ("POST", "/v1/chat/completions"): self.chat,
            ("POST", "/v1/completions"): self.completions,
            ("POST", "/v1/embeddings"): self.embeddings,
            ("POST", "/v1/cache/feedback"): self.cache_feedback,
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        mounted = next((app for prefix, app in self.mounts.items()
                        if scope["path"] == prefix or scope["path"].startswith(prefix + "/")), None)
        if mounted is not None:
            await mounted(scope, receive, send)
            return
        path = scope["path"].rstrip("/") or "/"
        handler = self.routes.get((scope["method"], path))
        endpoint = path if handler is not None else "other"
        gauge = self.metrics.requests.http_streams
        gauge.inc()
        try:
            if handler is None:
                allowed = sorted(m for m, p in self.routes if p == path)
                if allowed:
                    err = ApiError(405, f"{scope['method']} is not allowed on {path} (use "
                                   f"{', '.join(allowed)})", headers=[("allow", ", ".join(allowed))])
                else:
                    err = ApiError(404, f"no endpoint {scope['method']} {path}",
                                   code="unknown_url")
                status = await send_error(send, err)
            else:
                status = await handler(scope, receive, send)
        except ApiError as err:
            status = await send_error(send, err)
        finally:
            gauge.dec()
        if status:
            self.metrics.requests.http.labels(endpoint, str(status)).inc()

    # ------------------------------------------------------------------ plain endpoints

    async def healthz(self, scope: Scope, receive: Receive, send: Send) -> int:
        return await send_json(send, 200, {"status": "ok"})

    async def readyz(self, scope: Scope, receive: Receive, send: Send) -> int:
        ok, why = self.node.ready_state()
        return await send_json(send, 200 if ok else 503, {"ready": ok, "reason": why})

    async def prometheus(self, scope: Scope, receive: Receive, send: Send) -> int:
        body = self.metrics.render()
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", METRICS_TYPE.encode()), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
        return 200

    async def list_models(self, scope: Scope, receive: Receive, send: Send) -> int:
        self.client_of(scope)
        return await send_json(send, 200, replies.model_list(self.node.entry.models(), self.started))

    async def embeddings(self, scope: Scope, receive: Receive, send: Send) -> int:
        """OpenAI's embeddings endpoint, answered by this node's sentence-embedding model."""
        self.client_of(scope)
        obj = await read_json_body(scope, receive, self.max_body_bytes)
        if not isinstance(obj, dict):
            raise ApiError(400, "the request body must be a JSON object")
        texts = obj.get("input")
        if isinstance(texts, str):
            texts = [texts]
        if (not isinstance(texts, list) or not texts or len(texts) > 2048
                or not all(isinstance(t, str) and t for t in texts)):
            raise ApiError(400, "input must be a non-empty string or a list of 1 to 2,048 of them",
                           param="input")
        if obj.get("encoding_format") not in (None, "float"):
            raise ApiError(400, "encoding_format: only \"float\" is supported", param="encoding_format")
        if obj.get("dimensions") is not None:
            raise ApiError(400, "dimensions is not supported: vectors have the model's own size",
                           param="dimensions")
        try:
            model, vectors, tokens = await self.node.entry.embed(texts)
        except MeshdError as e:
            raise from_meshd(e) from None
        if obj.get("model") not in (None, "", model):
            raise ApiError(404, f"this node embeds with {model!r}, not {obj.get('model')!r}",
                           param="model", code="model_not_found")
        return await send_json(send, 200, {
            "object": "list", "model": model,
            "data": [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)],
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        })

    async def cache_feedback(self, scope: Scope, receive: Receive, send: Send) -> int:
        """``{"request_id": ID, "verdict": "right" | "wrong"}`` on an answer (ID: its
        ``x-request-id``, or the response id ``chatcmpl-ID``); a wrong one's cache entry is
        removed (docs/cache.md)."""
        self.client_of(scope)
        obj = await read_json_body(scope, receive, self.max_body_bytes)
        rid = obj.get("request_id") if isinstance(obj, dict) else None
        if not isinstance(rid, str) or not rid:
            raise ApiError(400, "request_id must be the answer's x-request-id",
                           param="request_id")
        verdict = obj.get("verdict")
        if verdict not in ("right", "wrong"):
            raise ApiError(400, 'verdict must be "right" or "wrong"', param="verdict")
        rid = rid.removeprefix("chatcmpl-").removeprefix("cmpl-")
        try:
            out = await self.node.entry.cache_feedback(rid, verdict)
        except MeshdError as e:
            raise from_meshd(e, params={"rid": "request_id"}) from None
        return await send_json(send, 200, out)

    # ------------------------------------------------------------------ generation

    async def chat(self, scope: Scope, receive: Receive, send: Send) -> int:
        return await self._generate(scope, receive, send, self._chat_call)

    async def completions(self, scope: Scope, receive: Receive, send: Send) -> int:
        async def shape(body: Any) -> ApiCall:
            return completion_call(body)

        return await self._generate(scope, receive, send, shape)

    async def _chat_call(self, body: Any) -> ApiCall:
        """``chat_call`` with the model's chat template when the request has tools (its tool
        syntax decides how they are rendered: meshd.api.tool_template)."""
        model = wants_template(body)
        template = None
        if model is not None:
            try:
                template = await self.node.entry.chat_template(model)
            except MeshdError:
                template = None  # the entry chain says why when it renders the chat
        return chat_call(body, template)

    def client_of(self, scope: Scope) -> str:
        token = bearer_token(header(scope, b"authorization"))
        client = self.keys.refresh(trio.current_time()).client(token)
        if client is None:
            why = "no API key given (send Authorization: Bearer KEY)" if token is None else \
                "the API key is not valid"
            raise ApiError(401, why, code="invalid_api_key")
        return client

    async def _generate(self, scope: Scope, receive: Receive, send: Send,
                        shape: Callable[[Any], Awaitable[ApiCall]]) -> int:
        client = self.client_of(scope)
        obj = await read_json_body(scope, receive, self.max_body_bytes)
        call = await shape(obj)
        try:
            req = parse_submit({**call.fields, "client": client}, self.node.entry.new_request_id)
        except MeshdError as e:
            raise from_meshd(e, params=call.params) from None
        if call.stream:
            return await self._stream(req, call, receive, send)
        route: dict[str, Any] = {}

        async def emit(kind: str, payload: dict[str, Any]) -> None:
            if kind == "route":
                route.update(payload)

        stats, error = await self.submit(req, emit, receive)
        if stats is None and error is None:
            return 0  # the client went away
        rid = req.request_id
        if error is not None:
            err = from_meshd(error, params=call.params)
            err.headers.append(("x-request-id", rid))
            return await send_error(send, err)
        assert stats is not None
        model = req.model or str(stats.get("model"))
        fmt = call.tool_format if call.tools is not None else None
        answer = (replies.chat_completion(rid, int(time.time()), model, stats, tools=fmt,
                                          logprobs=call.logprobs) if call.kind == "chat" else
                  replies.text_completion(rid, int(time.time()), model, stats,
                                          logprobs=call.logprobs))
        return await send_json(send, 200, answer,
                               route_headers(rid, stats or route) + _call_headers(call))

    async def submit(self, req: EntryRequest, emit: Any, receive: Receive
                     ) -> tuple[dict[str, Any] | None, MeshdError | None]:
        """Run the request through the entry chain while watching for the client to go away;
        (stats, None), (None, error), or (None, None) when the client went away and the
        request was cancelled."""
        result: dict[str, Any] | None = None
        error: MeshdError | None = None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_cancel_on_disconnect, receive, nursery.cancel_scope)
            try:
                result = await self.node.entry.submit(req, emit)
            except MeshdError as e:
                error = e
            except Exception as e:  # a bug: answer 500, keep the server
                log.exception("api request failed rid=%s", req.request_id)
                error = MeshdError(f"internal error: {type(e).__name__}")
            finally:
                nursery.cancel_scope.cancel()
        if result is None and error is None:
            self.metrics.requests.disconnects.inc()
            log.info("api client went away rid=%s", req.request_id)
        return result, error

    async def _stream(self, req: EntryRequest, call: ApiCall, receive: Receive, send: Send) -> int:
        rid = req.request_id
        chunks = replies.Chunks(call.kind, rid, int(time.time()), req.model or "", call.include_usage)
        started = False
        route: dict[str, Any] = {}
        sent_text: list[str] = []
        # per choice: text held back while it may still be a tool call, whether it is one (None:
        # not known yet), and how many of its calls went out (each once whole, when the format
        # closes it: a chat template's tag; meshd's generic object only at the end)
        held: dict[int, list[str]] = {}
        held_lp: dict[int, list[Any]] = {}
        is_call: dict[int, bool | None] = {}
        calls_sent: dict[int, int] = {}
        fmt = call.tool_format

        async def start(data: bytes) -> None:
            """The headers, then the role chunk(s) and ``data`` in one write."""
            nonlocal started
            started = True
            headers = [(b"content-type", sse.CONTENT_TYPE), (b"cache-control", b"no-cache"),
                       *route_headers(rid, route), *_call_headers(call)]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await _body(send, chunks.firsts(call.n) + data)

        async def out(data: bytes) -> None:
            if started:
                await _body(send, data)
            else:
                await start(data)

        def delta(i: int, text: str, lp: list[Any] | None) -> bytes:
            """The chunk for a choice's text, or nothing while it is held (tools)."""
            if call.tools is None:
                return chunks.delta_event(text, i, lp)
            held.setdefault(i, []).append(text)
            if lp is not None:
                held_lp.setdefault(i, []).extend(lp)
            if is_call.get(i) is None:
                is_call[i] = True if call.tools.forced else fmt.starts_call("".join(held[i]))
            if is_call[i] is False:  # text: what was held goes out now
                data = chunks.delta_event("".join(held.pop(i)), i, held_lp.pop(i, None)
                                          if call.logprobs else None)
                return data
            if is_call[i]:
                done, _ = fmt.split_calls("".join(held[i]), rid, i)
                sent = calls_sent.get(i, 0)
                if len(done) > sent:
                    calls_sent[i] = len(done)
                    return chunks.tool_calls_event(done[sent:], i, sent)
            return b""

        async def emit(kind: str, payload: dict[str, Any]) -> None:
            if kind == "route":
                if not started:
                    route.update(payload)  # its headers go out with the first tokens
                else:  # a failover after the headers: say so in a comment clients skip
                    names = ",".join(str(n) for n in payload.get("route") or [])
                    await _body(send, sse.comment(f"route served_by={payload.get('served_by')} "
                                                  f"route={names}"))
                return
            if kind == "tokens" and (payload.get("text") or payload.get("lp")):
                i = int(payload.get("idx") or 0)
                if i == 0:
                    sent_text.append(payload.get("text") or "")
                data = delta(i, payload.get("text") or "", payload.get("lp"))
                if data or not started:
                    await out(data)

        stats, error = await self.submit(req, emit, receive)
        if stats is None and error is None:
            return 0
        if error is not None:
            err = from_meshd(error, params=call.params)
            if not started:
                err.headers.append(("x-request-id", rid))
                return await send_error(send, err)
            await _body(send, sse.event(err.body()) + sse.DONE, more=False)
            return 200  # the status that went out; the error is in the stream
        assert stats is not None
        if not started:
            route.update({k: stats[k] for k in ("served_by", "route") if stats.get(k)})
            await start(b"")
        tail = b""
        if call.n == 1 and call.tools is None:  # text the stream did not carry (a cache hit)
            text = str(stats.get("text") or "")
            said = "".join(sent_text)
            if len(text) > len(said) and text.startswith(said):
                tail = chunks.text_event(text[len(said):])
        ends = b""
        for c in replies.choices_of(stats):
            i = int(c["index"])
            finish = str(c.get("finish_reason") or replies.finish_reason(stats))
            if call.tools is not None and (held.get(i) or is_call.get(i)):
                text = "".join(held.pop(i, []))
                calls = fmt.parse_reply(text, rid, i) if is_call.get(i) else None
                sent = calls_sent.get(i, 0)
                if calls:
                    if len(calls) > sent:
                        ends += chunks.tool_calls_event(calls[sent:], i, sent)
                    finish = "tool_calls"
                else:  # text, or cut short (max_tokens, a stop string) after the calls sent
                    done, rest = fmt.split_calls(text, rid, i) if is_call.get(i) else ([], text)
                    if len(done) > sent:
                        ends += chunks.tool_calls_event(done[sent:], i, sent)
                    if rest:
                        ends += chunks.delta_event(rest, i, held_lp.pop(i, None)
                                                   if call.logprobs else None)
            ends += chunks.last_event(finish, i)
        usage = chunks.usage(stats)
        await _body(send, tail + ends + (sse.event(usage) if usage is not None else b"")
                    + sse.DONE, more=False)
        return 200


async def _cancel_on_disconnect(receive: Receive, scope: trio.CancelScope) -> None:
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            scope.cancel()
            return


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        msg = await receive()
        if msg["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif msg["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


def header(scope: Scope, name: bytes) -> bytes | None:
    """The value of request header ``name`` (lower case), None when absent."""
    for k, v in scope["headers"]:
        if k == name:
            return bytes(v)
    return None


def _call_headers(call: ApiCall) -> list[tuple[bytes, bytes]]:
    """``x-meshd-tool-format``: how the request's tools were rendered and its calls written,
    ``generic`` (meshd's format) or a chat template's family (``hermes``, ``llama3``;
    docs/api.md, "Tools")."""
    if call.tools is None:
        return []
    return [(b"x-meshd-tool-format", call.tool_format.name.encode())]


def route_headers(rid: str, route: dict[str, Any]) -> list[tuple[bytes, bytes]]:
    out = [(b"x-request-id", rid.encode())]
    served_by = route.get("served_by")
    if served_by:
        out.append((b"x-meshd-served-by", str(served_by).encode()))
    names = route.get("route")
    if names:
        out.append((b"x-meshd-route", ",".join(str(n) for n in names).encode()))
    # how the entry node's cache answered: exact, semantic (with the cosine similarity), or miss
    cache = route.get("cache") if route.get("cached") else None
    kind = str(cache.get("kind")) if isinstance(cache, dict) else "miss"
    out.append((b"x-meshd-cache", kind.encode()))
    if kind == "semantic" and isinstance(cache, dict) and cache.get("similarity") is not None:
        out.append((b"x-meshd-cache-similarity", f"{float(cache['similarity']):.4f}".encode()))
    return out


async def read_json_body(scope: Scope, receive: Receive, limit: int) -> Any:
    """The request body (at most ``limit`` bytes) parsed as JSON; 400 when it is not JSON."""
    body = await read_body(scope, receive, limit)
    try:
        return json.loads(body)
    except ValueError as e:
        raise ApiError(400, f"the request body is not valid JSON: {e}") from None


async def read_body(scope: Scope, receive: Receive, limit: int) -> bytes:
    length = header(scope, b"content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise ApiError(413, f"the request body is {int(length)} bytes; the limit is {limit}",
                       code="request_too_large")
    parts: list[bytes] = []
    size = 0
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            raise ApiError(400, "the client went away before sending the whole body")
        chunk = msg.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise ApiError(413, f"the request body is over the limit of {limit} bytes",
                           code="request_too_large")
        parts.append(chunk)
        if not msg.get("more_body", False):
            return b"".join(parts)


async def _body(send: Send, data: bytes, *, more: bool = True) -> None:
    await send({"type": "http.response.body", "body": data, "more_body": more})


async def send_json(send: Send, status: int, obj: Any,
                    headers: list[tuple[bytes, bytes]] | None = None) -> int:
    body = _json(obj)
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", JSON_TYPE), (b"content-length", str(len(body)).encode()),
        *(headers or [])]})
    await send({"type": "http.response.body", "body": body})
    return status


async def send_error(send: Send, err: ApiError) -> int:
    headers = [(k.encode(), v.encode()) for k, v in err.headers]
    if err.status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    return await send_json(send, err.status, err.body(), headers)


__all__ = ["ApiApp", "ErrorCode"]
