"""A small HTTP/1.1 server for one ASGI app: h11 parses and frames, trio does the I/O.

h11 (the protocol, sans I/O) does every byte of HTTP: request parsing with size caps, keep-alive,
chunked transfer encoding, the connection's state machine. This module is the thin trio wrapper
around it, in the shape of h11's own trio example server, plus what the API needs:

- the ASGI ``receive`` reports ``http.disconnect`` as soon as the client closes, even while the
  app is streaming its answer (it reads the socket then): that is what cancels a request across
  the mesh;
- ``http.response.start`` is held until the first body, so the head and the first chunk (the first
  token of a stream) go out in one write; each later body is one write;
- an idle keep-alive connection waits at most ``keep_alive_timeout_s`` for its next request, and
  a request head must arrive within it too.

Why not hypercorn (the first version used its trio worker): measured on the 2-core development
machine, its per-request and per-send machinery (an app task and a queue per request, a lock and
a shielded scope per write, the head and the first body as two writes) put 1.7 ms between the
control socket's first token and the API's; this server cuts that to the figure in
docs/benchmarks.md. Only HTTP/1.1 over plain TCP is served (no TLS, no HTTP/2): the API listens on
loopback or behind a proxy that terminates TLS.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import unquote

import h11
import trio

log = logging.getLogger(__name__)

App = Callable[[dict[str, Any], Callable[[], Awaitable[dict[str, Any]]],
                Callable[[dict[str, Any]], Awaitable[None]]], Awaitable[None]]
MAX_RECV = 65536
MAX_HEAD_BYTES = 64 * 1024  # a request line plus headers larger than this is refused (431/400)
DRAIN_MAX_BYTES = 64 * 1024  # an unread request body up to this is read to keep the connection
DRAIN_TIMEOUT_S = 1.0


class _Exchange:
    """One request and its response on a connection: the ASGI receive and send."""

    def __init__(self, conn: h11.Connection, stream: trio.SocketStream) -> None:
        self.conn = conn
        self.stream = stream
        self.head: h11.Response | None = None
        self.started = False  # the response head went out
        self.finished = False  # the whole response went out
        self.disconnected = False
        self.body_done = False

    async def _more(self) -> bool:
        """Read from the client into h11; False when it closed the connection."""
        try:
            data = await self.stream.receive_some(MAX_RECV)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            data = b""
        if not data:
            self.disconnected = True
            return False
        self.conn.receive_data(data)
        return True

    async def receive(self) -> dict[str, Any]:
        while not self.body_done and not self.disconnected:
            try:
                ev = self.conn.next_event()
            except h11.RemoteProtocolError:
                self.disconnected = True
                break
            if ev is h11.NEED_DATA:
                if self.conn.they_are_waiting_for_100_continue:
                    await self._send_raw(self.conn.send(
                        h11.InformationalResponse(status_code=100, headers=[])) or b"")
                await self._more()
            elif isinstance(ev, h11.Data):
                return {"type": "http.request", "body": bytes(ev.data), "more_body": True}
            elif isinstance(ev, h11.EndOfMessage):
                self.body_done = True
                return {"type": "http.request", "body": b"", "more_body": False}
            elif isinstance(ev, h11.ConnectionClosed):
                self.disconnected = True
        # the body is read: wait for the client to go away (a pipelined request's bytes are
        # kept by h11 for the next cycle)
        while not self.disconnected:
            await self._more()
        return {"type": "http.disconnect"}

    async def send(self, msg: dict[str, Any]) -> None:
        if self.disconnected or self.finished:
            return  # the client is gone: the app learns it from receive()
        kind = msg["type"]
        if kind == "http.response.start":
            headers = [(bytes(k), bytes(v)) for k, v in msg.get("headers", [])]
            self.head = h11.Response(status_code=int(msg["status"]), headers=headers)
            return
        if kind != "http.response.body":
            raise RuntimeError(f"unexpected ASGI message {kind}")
        if self.head is None:
            raise RuntimeError("http.response.body before http.response.start")
        out = b""
        if not self.started:
            out = self.conn.send(self.head) or b""
            self.started = True
        body = msg.get("body", b"")
        if body:
            out += self.conn.send(h11.Data(data=body)) or b""
        if not msg.get("more_body", False):
            out += self.conn.send(h11.EndOfMessage()) or b""
            self.finished = True
        await self._send_raw(out)

    async def _send_raw(self, data: bytes) -> None:
        try:
            await self.stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self.disconnected = True


async def _next_request(conn: h11.Connection, stream: trio.SocketStream,
                        timeout_s: float) -> h11.Request | None:
    """The next request's head, or None when the client closed or was idle too long."""
    with trio.move_on_after(timeout_s):
        while True:
            ev = conn.next_event()
            if ev is h11.NEED_DATA:
                try:
                    data = await stream.receive_some(MAX_RECV)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    return None
                conn.receive_data(data)
                continue
            if isinstance(ev, h11.Request):
                return ev
            return None  # ConnectionClosed, or PAUSED after a close
    return None


async def _drain(conn: h11.Connection, stream: trio.SocketStream) -> bool:
    """Read the rest of a request body the app did not want (a GET's empty body, a refused
    upload) so the connection can serve the next request; False to close it instead."""
    left = DRAIN_MAX_BYTES
    with trio.move_on_after(DRAIN_TIMEOUT_S):
        while conn.their_state is h11.SEND_BODY:
            ev = conn.next_event()
            if ev is h11.NEED_DATA:
                data = await stream.receive_some(MAX_RECV)
                if not data:
                    return False
                conn.receive_data(data)
            elif isinstance(ev, h11.Data):
                left -= len(ev.data)
                if left < 0:
                    return False
        return True
    return False


def _scope(req: h11.Request, client: Any, server: Any) -> dict[str, Any]:
    target = bytes(req.target)
    path, _, query = target.partition(b"?")
    return {
        "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": req.http_version.decode(), "method": req.method.decode(),
        "scheme": "http", "path": unquote(path.decode("ascii", "replace")), "raw_path": path,
        "query_string": query, "root_path": "",
        "headers": [(bytes(k), bytes(v)) for k, v in req.headers],
        "client": client, "server": server,
    }


async def _error(conn: h11.Connection, stream: trio.SocketStream, status: int) -> None:
    """A bare error answer where the request could not reach the app, then close."""
    body = b'{"error":{"message":"bad HTTP request","type":"invalid_request_error","param":null,"code":null}}'
    try:
        out = conn.send(h11.Response(status_code=status, headers=[
            ("content-type", "application/json"), ("content-length", str(len(body))),
            ("connection", "close")])) or b""
        out += (conn.send(h11.Data(data=body)) or b"") + (conn.send(h11.EndOfMessage()) or b"")
        with trio.move_on_after(2):
            await stream.send_all(out)
    except (h11.LocalProtocolError, trio.BrokenResourceError, trio.ClosedResourceError):
        pass


class H11Server:
    """Serves ``app`` on a bound listening socket until cancelled."""

    def __init__(self, app: App, *, keep_alive_timeout_s: float = 75.0) -> None:
        self.app = app
        self.keep_alive_timeout_s = keep_alive_timeout_s
        self.connections = 0
        self.requests = 0

    async def serve(self, sock: socket.socket, *,
                    task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        sock.listen(1024)
        listener = trio.SocketListener(trio.socket.from_stdlib_socket(sock))
        await trio.serve_listeners(self.handle, [listener], task_status=task_status)

    async def handle(self, stream: trio.SocketStream) -> None:
        self.connections += 1
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
        sock = stream.socket
        try:
            client, server = sock.getpeername()[:2], sock.getsockname()[:2]
        except OSError:
            return
        try:
            while True:
                try:
                    req = await _next_request(conn, stream, self.keep_alive_timeout_s)
                except h11.RemoteProtocolError as e:
                    await _error(conn, stream, e.error_status_hint)
                    return
                if req is None:
                    return
                self.requests += 1
                ex = _Exchange(conn, stream)
                try:
                    await self.app(_scope(req, client, server), ex.receive, ex.send)
                except Exception:
                    log.exception("api handler failed")
                    if not ex.started and not ex.disconnected:
                        await _error(conn, stream, 500)
                    return
                if ex.disconnected or not ex.finished:
                    return
                if conn.their_state is h11.SEND_BODY and not await _drain(conn, stream):
                    return  # a large body the app did not read: not worth reading to keep alive
                if conn.their_state is not h11.DONE or conn.our_state is not h11.DONE:
                    return  # "connection: close", or an error
                conn.start_next_cycle()
        finally:
            self.connections -= 1
            with trio.move_on_after(1) as scope:
                scope.shield = True
                await stream.aclose()
