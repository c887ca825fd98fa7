"""The web console's HTTP side, mounted at ``/ui`` on the API listener (docs/console.md).

    GET /ui/                  the page (static files of ./static: no key needed, no data in them)
    GET /ui/<file>            its scripts, style and icon
    GET /ui/api/whoami        the key's client name, the node's name, the advert interval
    GET /ui/api/events        server-sent events: "mesh" (the map) once per advert interval,
                              "requests" (the last requests) at once, then "request" as each ends
    GET /ui/api/requests/ID   one request: its row and its explanation (`meshd explain`)
    GET /ui/api/node          identity, certificate, status, configuration, latest audit events
    GET /ui/api/metrics       the Prometheus metrics, in words

Every ``/ui/api`` call needs the API's bearer key (``Authorization: Bearer KEY``), or nothing
when ``[api] auth = "none"`` (loopback only). The page sends it with ``fetch``, the event stream
included: that is why the stream is read with ``fetch`` and not ``EventSource``, which cannot send
a header. Every answer carries a Content-Security-Policy that allows only this origin's own
scripts and styles, nothing inline: the key the page keeps in ``sessionStorage`` is out of reach
of anything injected into a node name or a model's answer (the page writes all text as text).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any

import trio

from meshd.api.app import Receive, Scope, Send, header, send_error
from meshd.api.console.atlas import mesh_map
from meshd.api.console.requests import RecentRequests
from meshd.api.console.source import ConsoleSource
from meshd.api.console.words import config_summary, metrics_in_words
from meshd.api.errors import ApiError
from meshd.store.explain import explain_text

log = logging.getLogger(__name__)

PREFIX = "/ui"
TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
         ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}
SECURITY_HEADERS = [
    (b"content-security-policy", b"default-src 'none'; script-src 'self'; style-src 'self'; "
     b"img-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'none'; "
     b"frame-ancestors 'none'"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
]
REQUEST_ID = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
BACKLOG = 50  # requests a new event stream starts with
AUDIT_EVENTS = 20

Authorize = Callable[[Scope], str]  # the client's name, or raises ApiError(401)


class Asset:
    """One static file, with its gzip form and its ETag, read once at start."""

    def __init__(self, name: str, body: bytes) -> None:
        self.name = name
        self.body = body
        self.gzipped = gzip.compress(body, compresslevel=9, mtime=0)
        self.etag = b'"' + hashlib.sha256(body).hexdigest()[:20].encode() + b'"'
        self.type = TYPES.get(name[name.rfind("."):], "application/octet-stream").encode()


def load_assets() -> dict[str, Asset]:
    """The files of the ``static`` folder shipped in the package (package-data)."""
    folder = resources.files("meshd.api.console") / "static"
    return {f.name: Asset(f.name, f.read_bytes()) for f in folder.iterdir()
            if f.is_file() and f.name[f.name.rfind("."):] in TYPES}


class ConsoleApp:
    """ASGI app of everything under ``/ui``. ``authorize`` is the API's own key check;
    ``render_metrics`` the body of ``/metrics``."""

    def __init__(self, source: ConsoleSource, status: Callable[[], dict[str, Any]],
                 authorize: Authorize, render_metrics: Callable[[], bytes], *,
                 advert_interval_s: float, wall_clock: Callable[[], float] = time.time) -> None:
        self.source = source
        self.status = status
        self.authorize = authorize
        self.render_metrics = render_metrics
        self.interval_s = advert_interval_s
        self.wall_clock = wall_clock
        self.assets = load_assets()
        self.requests = RecentRequests(wall_clock)
        self.requests.on_change = self._notify
        self._changed = trio.Event()
        self._mesh: tuple[float, bytes] | None = None  # (trio time made, the event)
        self.streams = 0  # event streams open now
        self.api: dict[str, Callable[[Scope, Receive, Send], Awaitable[int]]] = {
            "events": self.events, "node": self.node, "metrics": self.metrics,
        }

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self.route(scope, receive, send)
        except ApiError as err:
            if scope["method"] == "HEAD":  # the status and headers alone: a HEAD has no body
                await _send(send, err.status, b"", [(k.encode(), v.encode()) for k, v in err.headers])
            else:
                await send_error(send, err)

    async def route(self, scope: Scope, receive: Receive, send: Send) -> int:
        path = scope["path"]
        rest = path[len(PREFIX) + 1:]
        reading = ("GET",) if rest.startswith("api/") else ("GET", "HEAD")  # HEAD: files only
        if scope["method"] not in reading:
            raise ApiError(405, f"{scope['method']} is not allowed on {path} (the console only "
                           "reads)", headers=[("allow", ", ".join(reading))])
        if path == PREFIX:
            return await _send(send, 308, b"", [(b"location", b"/ui/")])
        if rest.startswith("api/"):
            name, _, arg = rest[4:].partition("/")
            if name == "whoami" and not arg:  # says whether the key is good, without a 401
                return await self.whoami(scope, receive, send)
            self.authorize(scope)
            if name == "requests" and arg:
                return await self.explain(arg, send)
            handler = self.api.get(name) if not arg else None
            if handler is None:
                raise ApiError(404, f"no console endpoint {path}", code="unknown_url")
            return await handler(scope, receive, send)
        asset = self.assets.get(rest or "index.html")
        if asset is None:
            raise ApiError(404, f"no console file {path}", code="unknown_url")
        return await self.file(scope, asset, send)

    async def file(self, scope: Scope, asset: Asset, send: Send) -> int:
        headers = [(b"content-type", asset.type), (b"etag", asset.etag),
                   (b"cache-control", b"no-cache"), (b"vary", b"accept-encoding")]
        if header(scope, b"if-none-match") == asset.etag:
            return await _send(send, 304, b"", headers)
        body = asset.body
        if b"gzip" in (header(scope, b"accept-encoding") or b""):
            body = asset.gzipped
            headers.append((b"content-encoding", b"gzip"))
        if scope["method"] == "HEAD":
            headers.append((b"content-length", str(len(body)).encode()))
            return await _send(send, 200, b"", headers, length=False)
        return await _send(send, 200, body, headers)

    # ------------------------------------------------------------------ reads

    async def whoami(self, scope: Scope, receive: Receive, send: Send) -> int:
        """``{"ok": true, "client", "node", ...}`` for a good key (or none needed), else
        ``{"ok": false, "why"}`` and nothing about the node: answered 200 either way, so that
        the page's first look (before it has asked for a key) is not an error."""
        auth = self.source.config.api.auth
        try:
            client = self.authorize(scope)
        except ApiError as err:
            return await _send_json(send, {"ok": False, "why": err.message, "auth": auth})
        ident = self.source.identity()
        return await _send_json(send, {
            "ok": True, "client": client, "node": ident.get("name"),
            "peer_id": ident.get("peer_id"), "auth": auth, "advert_interval_s": self.interval_s})

    async def explain(self, request_id: str, send: Send) -> int:
        if not REQUEST_ID.match(request_id):
            raise ApiError(400, "a request id is 1-64 letters, digits, '.', '_' or '-'")
        record = await self.source.explain(request_id)
        row = self.requests.get(request_id)
        if record is None and row is None:
            raise ApiError(404, f"no request {request_id} in this node's journal",
                           code="not_found")
        return await _send_json(send, {"row": row, "record": record,
                                       "text": explain_text(record) if record else None})

    async def node(self, scope: Scope, receive: Receive, send: Send) -> int:
        status = self.status()
        audit = await self.source.audit(AUDIT_EVENTS)
        return await _send_json(send, {"identity": self.source.identity(), "status": status,
                                       "config": config_summary(self.source.config),
                                       "audit": audit, "now": self.wall_clock()})

    async def metrics(self, scope: Scope, receive: Receive, send: Send) -> int:
        return await _send_json(send, {"metrics": metrics_in_words(self.render_metrics().decode())})

    # ------------------------------------------------------------------ the event stream

    def mesh_event(self) -> bytes:
        """The map as an event; made at most once per half advert interval, however many
        consoles are open."""
        now = trio.current_time()
        if self._mesh is not None and now - self._mesh[0] < self.interval_s / 2:
            return self._mesh[1]
        view = mesh_map(self.source.mesh())
        view.update(t=round(self.wall_clock(), 3), interval_s=self.interval_s)
        event = sse_event("mesh", view)
        self._mesh = (now, event)
        return event

    async def events(self, scope: Scope, receive: Receive, send: Send) -> int:
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache"),
            *SECURITY_HEADERS]})
        self.streams += 1
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_cancel_on_disconnect, receive, nursery.cancel_scope)
                await self._pump(send)
        finally:
            self.streams -= 1
        return 200

    async def _pump(self, send: Send) -> None:
        version = self.requests.version
        backlog = [row for _, row in list(self.requests.rows)[-BACKLOG:]]
        await _more(send, sse_event("requests", backlog) + self.mesh_event())
        next_mesh = trio.current_time() + self.interval_s
        while True:
            changed = self._changed
            with trio.move_on_at(next_mesh):
                await changed.wait()
            out = b""
            for row in self.requests.since(version):
                out += sse_event("request", row)
            version = self.requests.version
            if trio.current_time() >= next_mesh:
                try:
                    out += self.mesh_event()
                except Exception:  # a bug must not end the stream: the next tick tries again
                    log.exception("console mesh view failed")
                next_mesh = trio.current_time() + self.interval_s
            if out:
                await _more(send, out)


def sse_event(name: str, obj: Any) -> bytes:
    """A named server-sent event carrying ``obj`` as one line of JSON."""
    data = json.dumps(obj, separators=(",", ":"), ensure_ascii=False, default=str)
    return b"event: " + name.encode() + b"\ndata: " + data.encode() + b"\n\n"


async def _cancel_on_disconnect(receive: Receive, scope: trio.CancelScope) -> None:
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            scope.cancel()
            return


async def _more(send: Send, data: bytes) -> None:
    await send({"type": "http.response.body", "body": data, "more_body": True})


async def _send(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]],
                *, length: bool = True) -> int:
    extra = [(b"content-length", str(len(body)).encode())] if length else []
    await send({"type": "http.response.start", "status": status,
                "headers": [*headers, *extra, *SECURITY_HEADERS]})
    await send({"type": "http.response.body", "body": body})
    return status


async def _send_json(send: Send, obj: Any) -> int:
    body = json.dumps(obj, separators=(",", ":"), ensure_ascii=False, default=str).encode()
    return await _send(send, 200, body, [(b"content-type", b"application/json"),
                                         (b"cache-control", b"no-store")])


__all__ = ["PREFIX", "ConsoleApp", "sse_event"]
