"""The local control socket: a unix socket, owner-only, speaking versioned msgpack frames.

One connection carries a HELLO exchange and then one request (SUBMIT, STATUS_REQ, PEERS_REQ,
EXPLAIN_REQ). Closing the connection cancels the request it carried. Malformed frames get an
ERROR frame and the connection is closed; the daemon keeps serving everyone else.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import stat
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

import trio

from meshd.core.messages import CONTROL_TYPES, CONTROL_VERSION, MessageType
from meshd.core.wire import MAX_CONTROL_FRAME, Message
from meshd.errors import (
    ConfigError,
    ErrorCode,
    MeshdError,
    PeerGoneError,
    ProtocolError,
    RemoteError,
)
from meshd.net.framed import FramedStream, TrioStreamAdapter

log = logging.getLogger(__name__)

HELLO_TIMEOUT_S = 5.0
REQUEST_TIMEOUT_S = 5.0  # after HELLO_OK, the request frame must arrive whole within this


class ControlHandler(Protocol):
    node_name: str
    peer_id: str

    async def handle_control(self, msg: Message, out: FramedStream) -> None:
        """Answer one request message, writing frames to ``out``."""


def prepare_socket_path(path: Path) -> None:
    """Make ``path`` ready to bind: create its folder, remove a dead daemon's stale socket.
    ``ConfigError`` (one line) when it cannot be: a regular file on the path, a live daemon
    already serving it, a folder we may not create."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as e:
        raise ConfigError(f"control socket {path}: cannot use the folder {path.parent} "
                          f"({_why(e, path.parent)})") from None
    if path.exists() or path.is_symlink():
        mode = path.lstat().st_mode
        if not stat.S_ISSOCK(mode):
            raise ConfigError(f"control socket {path} exists and is not a socket; refusing to replace it")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(path))
        except OSError:
            path.unlink()  # a stale socket of a dead daemon
        else:
            raise ConfigError(f"control socket {path} is already served by another running daemon")
        finally:
            probe.close()


def _why(err: OSError, folder: Path) -> str:
    """Which part of ``folder`` is in the way, when a regular file is."""
    if err.errno in (errno.EEXIST, errno.ENOTDIR):
        for p in (folder, *folder.parents):
            if p.exists() and not p.is_dir():
                return f"{p} is a file, not a folder"
    return err.strerror or type(err).__name__


class ControlServer:
    def __init__(self, path: Path, handler: ControlHandler, *,
                 extra: Mapping[int, Callable[[Message, FramedStream], Awaitable[None]]] | None = None,
                 hello_timeout_s: float = HELLO_TIMEOUT_S,
                 request_timeout_s: float = REQUEST_TIMEOUT_S) -> None:
        """``extra`` answers some request types itself (by type id) instead of ``handler``."""
        self.path = path
        self.handler = handler
        self.extra = dict(extra or {})
        self.hello_timeout_s = hello_timeout_s
        self.request_timeout_s = request_timeout_s
        self.stats = {"connections": 0, "malformed": 0, "errors": 0, "timeouts": 0}

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        prepare_socket_path(self.path)
        sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            await sock.bind(str(self.path))
        except OSError as e:
            sock.close()
            raise ConfigError(f"control socket {self.path}: cannot bind ({e.strerror})") from None
        finally:
            os.umask(old)
        os.chmod(self.path, 0o600)
        sock.listen(64)
        listener = trio.SocketListener(sock)
        try:
            async with trio.open_nursery() as nursery:
                task_status.started()
                await trio.serve_listeners(self._serve_one, [listener], handler_nursery=nursery)
        finally:
            try:
                self.path.unlink()
            except OSError:
                pass

    async def _serve_one(self, stream: trio.SocketStream) -> None:
        self.stats["connections"] += 1
        framed = FramedStream(TrioStreamAdapter(stream), MAX_CONTROL_FRAME, CONTROL_TYPES)
        try:
            with trio.fail_after(self.hello_timeout_s):
                hello = await framed.recv()
            if hello is None:
                return
            if hello["t"] != MessageType.HELLO:
                raise ProtocolError("the first frame must be HELLO")
            if hello["v"] != CONTROL_VERSION:
                raise RemoteError(
                    f"control protocol version {hello['v']} is not supported "
                    f"(this daemon speaks {CONTROL_VERSION}); upgrade meshd",
                    code=ErrorCode.UNSUPPORTED,
                )
            await framed.send(
                MessageType.HELLO_OK,
                {"v": CONTROL_VERSION, "node": self.handler.node_name, "peer_id": self.handler.peer_id},
            )
            # a client that stops half way through its request frame (or never sends one) must
            # not hold a handler and its socket forever
            with trio.fail_after(self.request_timeout_s):
                msg = await framed.recv()
            if msg is None:
                return
            answer = self.extra.get(msg["t"])
            await (answer(msg, framed) if answer else self.handler.handle_control(msg, framed))
        except trio.TooSlowError:
            self.stats["timeouts"] += 1
            log.info("control client too slow; connection closed")
        except PeerGoneError:
            pass  # the client went away
        except RemoteError as e:
            if isinstance(e, ProtocolError):
                self.stats["malformed"] += 1
            else:
                self.stats["errors"] += 1
            await _try_error(framed, e.code, str(e))
        except MeshdError as e:
            self.stats["errors"] += 1
            await _try_error(framed, getattr(e, "code", None) or ErrorCode.INTERNAL, str(e))
        except Exception:
            self.stats["errors"] += 1
            log.exception("control request failed")
            await _try_error(framed, ErrorCode.INTERNAL, "internal error; see the daemon log")
        finally:
            await framed.close()


async def _try_error(framed: FramedStream, code: str, message: str) -> None:
    with trio.move_on_after(1):
        try:
            await framed.send(MessageType.ERROR, {"code": code, "message": message[:1000]})
        except Exception:
            pass
