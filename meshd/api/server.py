"""Serve the HTTP API: ``await nursery.start(serve_api, node, cfg)``.

The app (``app.py``) is served by ``h11server.H11Server``: h11 for HTTP/1.1, trio for the I/O, in
the daemon's own trio loop and nursery tree (the module says why not hypercorn). The listening
socket is bound here first, so a port in use is one clear error (``LocalError``) and port 0 works
(the URL tells the port chosen).
"""

from __future__ import annotations

import logging
import socket
from typing import Any

import trio

from meshd.api.app import ApiApp
from meshd.api.auth import KeyFile
from meshd.api.console import PREFIX, ConsoleApp, ConsoleSource
from meshd.api.h11server import H11Server
from meshd.api.metrics import Metrics
from meshd.api.ollama.handlers import OllamaApi
from meshd.api.protocols import ServedNode
from meshd.config import Config, parse_listen
from meshd.errors import LocalError

log = logging.getLogger(__name__)
KEYS_CHECK_INTERVAL_S = 1.0  # a new or revoked key takes effect within this long


def bind_socket(listen: str) -> socket.socket:
    host, port = parse_listen(listen)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise LocalError(f"cannot listen on {listen} for the HTTP API ([api] listen): "
                         f"{e.strerror}") from None
    return sock


def base_url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/v1"


def build_app(node: ServedNode, cfg: Config, console: ConsoleSource | None = None) -> ApiApp:
    keys = KeyFile(cfg.path(cfg.api.keys_file), open_access=cfg.api.auth == "none",
                   check_interval_s=KEYS_CHECK_INTERVAL_S)
    metrics = Metrics(node)
    node.entry.observers.append(metrics.requests.observe)
    app = ApiApp(node, keys, metrics, max_body_bytes=cfg.api.max_body_bytes)
    app.routes.update(OllamaApi(app).routes())  # Ollama's API beside OpenAI's (docs/ollama.md)
    if console is not None:  # the web console at /ui (docs/console.md)
        ui = ConsoleApp(console, node.status, app.client_of, metrics.render,
                        advert_interval_s=cfg.gossip.advert_interval_s)
        node.entry.observers.append(ui.requests.observe)
        app.mounts[PREFIX] = ui
    return app


async def serve_api(node: ServedNode, cfg: Config, console: ConsoleSource | None = None, *,
                    task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    """Serve the API of ``node`` until cancelled; ``started`` with the base URL
    (``http://HOST:PORT/v1``). With ``[api] listen = ""`` the API is off: started with None at
    once. With ``console``, the web console too, at ``/ui``."""
    if not cfg.api.listen:
        task_status.started(None)
        return
    app = build_app(node, cfg, console)
    sock = bind_socket(cfg.api.listen)
    url = base_url(sock)
    if cfg.api.auth == "none":
        log.warning("api listening without keys (auth = none) url=%s", url)
    log.info("api listening url=%s auth=%s", url, cfg.api.auth)
    server = H11Server(app, keep_alive_timeout_s=cfg.api.keep_alive_timeout_s)
    await server.serve(sock, task_status=_Started(task_status, url))


class _Started:
    """Passes ``started(url)`` on where the server calls ``started(listeners)``."""

    def __init__(self, inner: Any, url: str) -> None:
        self.inner = inner
        self.url = url

    def started(self, value: Any = None) -> None:
        self.inner.started(self.url)
