"""The API's HTTP/1.1 server on raw sockets: keep-alive, pipelining, 100-continue, bad requests,
idle timeout, and a disconnect seen while the app streams."""

from __future__ import annotations

from typing import Any

import trio

from meshd.api.h11server import H11Server
from meshd.api.server import bind_socket


async def echo(scope: dict[str, Any], receive: Any, send: Any) -> None:
    body = b""
    while True:
        msg = await receive()
        body += msg.get("body", b"")
        if not msg.get("more_body"):
            break
    out = f"{scope['method']} {scope['path']} {scope['query_string'].decode()} {len(body)}".encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", str(len(out)).encode())]})
    await send({"type": "http.response.body", "body": out})


async def read_until(stream: trio.SocketStream, marker: bytes, count: int = 1) -> bytes:
    got = b""
    with trio.fail_after(5):
        while got.count(marker) < count:
            data = await stream.receive_some(65536)
            if not data:
                break
            got += data
    return got


def serve(app: Any, body: Any, **kw: Any) -> Any:
    server = H11Server(app, **kw)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            sock = bind_socket("127.0.0.1:0")
            port = sock.getsockname()[1]
            await nursery.start(server.serve, sock)
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            await body(stream, server)
            await stream.aclose()
            nursery.cancel_scope.cancel()

    trio.run(main)
    return server


def test_keep_alive_and_pipelined_requests_are_answered_in_order() -> None:
    async def body(s: trio.SocketStream, server: H11Server) -> None:
        await s.send_all(b"GET /a?x=1 HTTP/1.1\r\nhost: h\r\n\r\n"
                         b"POST /b HTTP/1.1\r\nhost: h\r\ncontent-length: 3\r\n\r\nabc")
        got = await read_until(s, b"HTTP/1.1 200", 2)
        got += await read_until(s, b"POST /b  3") if b"POST /b  3" not in got else b""
        assert got.index(b"GET /a x=1 0") < got.index(b"POST /b  3")
        assert server.connections == 1

    serve(echo, body)


def test_a_body_the_app_does_not_read_does_not_cost_the_connection() -> None:
    async def no_read(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    async def body(s: trio.SocketStream, server: H11Server) -> None:
        for _ in range(3):
            await s.send_all(b"POST /x HTTP/1.1\r\nhost: h\r\ncontent-length: 5\r\n\r\nhello")
            assert (await read_until(s, b"ok")).startswith(b"HTTP/1.1 200")
        assert server.connections == 1 and server.requests == 3

    serve(no_read, body)


def test_expect_100_continue_is_answered() -> None:
    async def body(s: trio.SocketStream, server: H11Server) -> None:
        await s.send_all(b"POST /c HTTP/1.1\r\nhost: h\r\ncontent-length: 4\r\n"
                         b"expect: 100-continue\r\n\r\n")
        assert (await read_until(s, b"\r\n\r\n")).startswith(b"HTTP/1.1 100")
        await s.send_all(b"wxyz")
        assert b"POST /c  4" in await read_until(s, b"POST /c  4")

    serve(echo, body)


def test_a_malformed_request_is_a_400_and_closes() -> None:
    async def body(s: trio.SocketStream, server: H11Server) -> None:
        await s.send_all(b"NOT HTTP AT ALL\r\n\r\n")
        got = await read_until(s, b"never")
        assert got.startswith(b"HTTP/1.1 400") and b'"error"' in got

    serve(echo, body)


def test_an_oversized_head_is_refused() -> None:
    async def body(s: trio.SocketStream, server: H11Server) -> None:
        # a head that is still not complete after 64 KiB
        await s.send_all(b"GET / HTTP/1.1\r\nhost: h\r\nx-big: " + b"a" * 70_000)
        got = await read_until(s, b"never")
        assert got.startswith(b"HTTP/1.1 431")

    serve(echo, body)


def test_an_idle_connection_is_closed_after_the_keep_alive_timeout() -> None:
    async def body(s: trio.SocketStream, server: H11Server) -> None:
        with trio.fail_after(5):
            assert await s.receive_some(10) == b""  # closed by the server

    serve(echo, body, keep_alive_timeout_s=0.2)


def test_the_app_hears_a_disconnect_while_it_streams() -> None:
    heard = trio.Event()

    async def streamer(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()  # the (empty) body
        await send({"type": "http.response.start", "status": 200, "headers": []})
        async with trio.open_nursery() as nursery:
            async def watch() -> None:
                assert (await receive())["type"] == "http.disconnect"
                heard.set()
                nursery.cancel_scope.cancel()

            nursery.start_soon(watch)
            while True:
                await send({"type": "http.response.body", "body": b"tick\n", "more_body": True})
                await trio.sleep(0.01)

    async def body(s: trio.SocketStream, server: H11Server) -> None:
        await s.send_all(b"GET /s HTTP/1.1\r\nhost: h\r\n\r\n")
        got = await read_until(s, b"tick", 3)
        assert b"transfer-encoding: chunked" in got.lower()
        await s.aclose()
        with trio.fail_after(5):
            await heard.wait()

    serve(streamer, body)
