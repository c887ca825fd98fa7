"""Ollama's endpoints on the API's listener (docs/ollama.md): thin handlers over the OpenAI app.

A generation request is checked by ``shapes`` and goes through ``parse_submit`` and the app's
``submit``, the very path of ``POST /v1/chat/completions``: the same key, client name, quotas,
routing, tiers, cache, forwarding and audit record. Answers are made by ``replies``; every
error, before or during a stream, is Ollama's ``{"error": message}`` with the status meshd gives
that error on the OpenAI API.

``OllamaApi(app).routes()`` is what ``meshd.api.server.build_app`` adds to the app's routes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from meshd import __version__
from meshd.api.app import ApiApp, Receive, Scope, Send, read_json_body, route_headers, send_json
from meshd.api.errors import ApiError, from_meshd
from meshd.api.ollama import replies, shapes
from meshd.core.request import parse_submit
from meshd.errors import MeshdError

log = logging.getLogger(__name__)

Handler = Callable[[Scope, Receive, Send], Awaitable[int]]
# Ollama's model management: a clear 501 rather than the app's generic 404
NOT_SERVED = (("POST", "/api/pull"), ("POST", "/api/push"), ("POST", "/api/create"),
              ("POST", "/api/copy"), ("DELETE", "/api/delete"), ("GET", "/api/ps"))


class OllamaApi:
    def __init__(self, app: ApiApp) -> None:
        self.app = app
        self.modified_at = replies.created_at(app.started * 1_000_000_000)

    def routes(self) -> dict[tuple[str, str], Handler]:
        return {
            ("GET", "/api/tags"): self._ollama(self.tags),
            ("POST", "/api/show"): self._ollama(self.show),
            ("GET", "/api/version"): self._ollama(self.version),
            ("POST", "/api/chat"): self._ollama(self.chat),
            ("POST", "/api/generate"): self._ollama(self.generate),
            ("POST", "/api/embed"): self._ollama(self.embed),
            ("POST", "/api/embeddings"): self._ollama(self.embeddings),
            **{route: self._ollama(self.not_served) for route in NOT_SERVED},
        }

    def _ollama(self, handler: Handler) -> Handler:
        """``handler`` answering its errors in Ollama's shape."""

        async def run(scope: Scope, receive: Receive, send: Send) -> int:
            try:
                return await handler(scope, receive, send)
            except ApiError as err:
                return await send_error(send, err)

        return run

    async def _body(self, scope: Scope, receive: Receive) -> Any:
        return await read_json_body(scope, receive, self.app.max_body_bytes)

    def _models(self) -> dict[str, dict[str, Any]]:
        return {str(m["id"]): m for m in self.app.node.entry.models()}

    # ------------------------------------------------------------------ models

    async def tags(self, scope: Scope, receive: Receive, send: Send) -> int:
        self.app.client_of(scope)
        return await send_json(send, 200, replies.tags(self.app.node.entry.models(), self.modified_at))

    async def show(self, scope: Scope, receive: Receive, send: Send) -> int:
        self.app.client_of(scope)
        asked = shapes.show_name(await self._body(scope, receive))
        models = self._models()
        row = models.get(shapes.resolve_model(asked, models))
        if row is None:
            raise ApiError(404, f"model {asked!r} not found: no node of the mesh serves it "
                           f"(served: {', '.join(sorted(models)) or 'none yet'})")
        return await send_json(send, 200, replies.show(row, self.modified_at))

    async def not_served(self, scope: Scope, receive: Receive, send: Send) -> int:
        self.app.client_of(scope)
        raise ApiError(501, f"{scope['path']} is not served by meshd: a mesh's models are placed "
                       "with meshd's config and CLI (docs/models.md), not through the API")

    async def version(self, scope: Scope, receive: Receive, send: Send) -> int:
        self.app.client_of(scope)
        return await send_json(send, 200, {"version": __version__})

    # ------------------------------------------------------------------ embeddings

    async def embed(self, scope: Scope, receive: Receive, send: Send) -> int:
        start = time.perf_counter_ns()
        self.app.client_of(scope)
        asked, texts = shapes.embed_input(await self._body(scope, receive))
        _, vectors, tokens = await self._embed(asked, texts)
        return await send_json(send, 200, {
            "model": asked, "embeddings": vectors,
            "total_duration": time.perf_counter_ns() - start, "prompt_eval_count": tokens})

    async def embeddings(self, scope: Scope, receive: Receive, send: Send) -> int:
        self.app.client_of(scope)
        asked, prompt = shapes.embeddings_input(await self._body(scope, receive))
        _, vectors, _ = await self._embed(asked, [prompt])
        return await send_json(send, 200, {"embedding": vectors[0]})

    async def _embed(self, asked: str, texts: list[str]) -> tuple[str, list[list[float]], int]:
        """This node's sentence embeddings, as ``POST /v1/embeddings`` makes them."""
        try:
            model, vectors, tokens = await self.app.node.entry.embed(texts)
        except MeshdError as e:
            raise from_meshd(e) from None
        if not shapes.embed_model_matches(asked, model):
            raise ApiError(404, f"this node embeds with {model!r}, not {asked!r}")
        return model, vectors, tokens

    # ------------------------------------------------------------------ generation

    async def chat(self, scope: Scope, receive: Receive, send: Send) -> int:
        return await self._generate(scope, receive, send, shapes.chat_call)

    async def generate(self, scope: Scope, receive: Receive, send: Send) -> int:
        return await self._generate(scope, receive, send, shapes.generate_call)

    async def _generate(self, scope: Scope, receive: Receive, send: Send,
                        shape: Callable[[Any], shapes.OllamaCall]) -> int:
        start = time.perf_counter_ns()
        client = self.app.client_of(scope)
        call = shape(await self._body(scope, receive))
        if call.ignored:
            log.debug("ollama options ignored options=%s", ",".join(call.ignored))
        if call.unknown:
            log.warning("ollama options unknown, ignored options=%s", ",".join(call.unknown))
        model = call.model
        if call.load_only or call.num_ctx is not None or ":" in model:
            models = self._models()
            model = shapes.resolve_model(model, models)
            if call.load_only:
                if model not in models and model != "auto":
                    raise ApiError(404, f"model {call.model!r} not found: no node of the mesh "
                                   f"serves it (served: {', '.join(sorted(models)) or 'none yet'})")
                return await send_json(send, 200, replies.loaded(call.kind, call.model, time.time_ns()))
            row = models.get(model)
            shapes.check_num_ctx(call.num_ctx, model, row.get("context_length") if row else None)
        try:
            req = parse_submit({**call.fields, "model": model, "client": client},
                               self.app.node.entry.new_request_id)
        except MeshdError as e:
            raise from_meshd(e) from None
        return await _Answer(self.app, call, start).run(req, receive, send)


class _Answer:
    """One generation request's answer: NDJSON lines as tokens come, or one object at the end."""

    def __init__(self, app: ApiApp, call: shapes.OllamaCall, start_ns: int) -> None:
        self.app = app
        self.call = call
        self.start_ns = start_ns
        self.first_ns: int | None = None
        self.started = False  # the response head went out (streamed)
        self.route: dict[str, Any] = {}
        self.sent: list[str] = []

    async def run(self, req: Any, receive: Receive, send: Send) -> int:
        call, rid = self.call, req.request_id

        async def emit(kind: str, payload: dict[str, Any]) -> None:
            if kind == "route":
                if not self.started:
                    self.route.update(payload)  # its headers go out with the first text
                return
            if kind == "tokens" and payload.get("text"):
                if self.first_ns is None:
                    self.first_ns = time.perf_counter_ns()
                if call.stream:
                    self.sent.append(payload["text"])
                    data = replies.line(replies.piece(call.kind, call.model, time.time_ns(),
                                                      payload["text"]))
                    await self._write(send, rid, data)

        stats, error = await self.app.submit(req, emit, receive)
        if stats is None and error is None:
            return 0  # the client went away; the request was cancelled
        if error is not None:
            err = from_meshd(error)
            if not self.started:
                err.headers.append(("x-request-id", rid))
                return await send_error(send, err)
            await _body(send, replies.line(replies.error(err)), more=False)
            return 200  # the status that went out; the error is in the stream
        assert stats is not None
        timings = replies.Timings(self.start_ns, self.first_ns, time.perf_counter_ns())
        text = str(stats.get("text") or "")
        if not call.stream:
            return await send_json(send, 200, replies.final(call.kind, call.model, time.time_ns(),
                                                            stats, timings, text),
                                   route_headers(rid, stats))
        said = "".join(self.sent)
        tail = text[len(said):] if len(text) > len(said) and text.startswith(said) else ""
        if not self.started:
            self.route.update({k: stats[k] for k in ("served_by", "route", "cached") if stats.get(k)})
        last = replies.line(replies.final(call.kind, call.model, time.time_ns(), stats, timings, tail))
        await self._write(send, rid, last, more=False)
        return 200

    async def _write(self, send: Send, rid: str, data: bytes, *, more: bool = True) -> None:
        if not self.started:
            self.started = True
            await send({"type": "http.response.start", "status": 200, "headers": [
                (b"content-type", replies.CONTENT_TYPE), (b"cache-control", b"no-cache"),
                *route_headers(rid, self.route)]})
        await _body(send, data, more=more)


async def _body(send: Send, data: bytes, *, more: bool = True) -> None:
    await send({"type": "http.response.body", "body": data, "more_body": more})


async def send_error(send: Send, err: ApiError) -> int:
    headers = [(k.encode(), v.encode()) for k, v in err.headers]
    if err.status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    return await send_json(send, err.status, replies.error(err), headers)
