"""One error hierarchy for meshd.

``LocalError`` is our side: bad config, a missing model, a misused API. ``RemoteError`` is the
other side: a peer or a client sent something we reject; it carries the wire error code to reply
with (see ``proto/errors.md``). ``str(err)`` is always one line a person can read; the CLI prints
it and never a traceback.
"""

from __future__ import annotations


class MeshdError(Exception):
    """Base of every error meshd raises on purpose."""


class LocalError(MeshdError):
    """Our misuse or our user's input: config, files, arguments."""


class ConfigError(LocalError):
    """A configuration file or value is wrong; the message names the key and the file."""


class ModelError(LocalError):
    """A model directory or checkpoint cannot be used; the message says which file or field."""


class KeyFileError(LocalError):
    """A key or certificate file is missing, unreadable, or has unsafe permissions."""


class RoutingError(MeshdError):
    """No node may serve a request (every candidate excluded by a hard constraint, or none)."""


class RemoteError(MeshdError):
    """A peer or client sent something we reject. ``code`` is the wire error code to answer."""

    code: str = "internal"

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code


class ProtocolError(RemoteError):
    """Malformed bytes: bad framing, bad msgpack, a schema violation, an oversized frame."""

    code = "malformed"


class AttestationError(RemoteError):
    """A peer failed attestation: no certificate, wrong CA, wrong key, expired or revoked."""

    code = "unattested"


class BusyError(RemoteError):
    """The node's queue is full, or it cannot start the request within the wait the entry node
    allowed (``wait_ms``: its own estimate of the wait, when it gave one); try another."""

    code = "busy"

    def __init__(self, message: str, code: str | None = None, *, wait_ms: float | None = None) -> None:
        super().__init__(message, code)
        self.wait_ms = wait_ms


class PeerGoneError(RemoteError):
    """The peer closed, died or stalled while serving us."""

    code = "peer_gone"
