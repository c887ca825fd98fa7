"""One error hierarchy for meshd.

``LocalError`` is our side: bad config, a missing model, a misused API. ``RemoteError`` is the
other side: a peer or a client sent something we reject; it carries the wire error code to reply
with (see ``proto/errors.md``). ``str(err)`` is always one line a person can read; the CLI prints
it and never a traceback.
"""

from __future__ import annotations

import enum


class ErrorCode(enum.StrEnum):
    """Every error code meshd sends on the wire or answers a client with (proto/errors.md).

    The values are the wire strings. ONLY APPEND: peers of older versions read these.
    """

    MALFORMED = "malformed"
    TOO_LARGE = "too_large"
    UNSUPPORTED = "unsupported"
    UNATTESTED = "unattested"
    BUSY = "busy"
    NO_MODEL = "no_model"
    NO_ROUTE = "no_route"
    DEADLINE = "deadline"
    HOPS = "hops"
    CANCELLED = "cancelled"
    PEER_GONE = "peer_gone"
    BAD_TENSOR = "bad_tensor"
    QUOTA = "quota"
    INTERNAL = "internal"
    NO_SESSION = "no_session"
    CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
    DUPLICATE_REQUEST = "duplicate_request"
    UNAUTHORIZED = "unauthorized"
    NO_COLLECTION = "no_collection"


class MeshdError(Exception):
    """Base of every error meshd raises on purpose."""


class LocalError(MeshdError):
    """Our misuse or our user's input: config, files, arguments."""


class ConfigError(LocalError):
    """A configuration file or value is wrong; the message names the key and the file."""


class ModelError(LocalError):
    """A model directory or checkpoint cannot be used; the message says which file or field."""


class RegistryError(LocalError):
    """A package could not be fetched from its registry (unreachable, or without the package);
    the message summarises what the registry client said."""


class KeyFileError(LocalError):
    """A key or certificate file is missing, unreadable, or has unsafe permissions."""


class RoutingError(MeshdError):
    """No node may serve a request (every candidate excluded by a hard constraint, or none).

    Raised by the pure router; the entry chain answers the client with ``code``."""

    code: ErrorCode = ErrorCode.NO_ROUTE


class QuotaError(RoutingError):
    """The client has as many requests in flight as its quota allows."""

    code = ErrorCode.QUOTA


class RemoteError(MeshdError):
    """A peer or client sent something we reject. ``code`` is the wire error code to answer."""

    code: str = ErrorCode.INTERNAL

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = ErrorCode(code) if code in ErrorCode.__members__.values() else code


class ProtocolError(RemoteError):
    """Malformed bytes: bad framing, bad msgpack, a schema violation, an oversized frame."""

    code = ErrorCode.MALFORMED


class AttestationError(RemoteError):
    """A peer failed attestation: no certificate, wrong CA, wrong key, expired or revoked."""

    code = ErrorCode.UNATTESTED


class BusyError(RemoteError):
    """The node's queue is full, or it cannot start the request within the wait the entry node
    allowed (``wait_ms``: its own estimate of the wait, when it gave one); try another."""

    code = ErrorCode.BUSY

    def __init__(self, message: str, code: str | None = None, *, wait_ms: float | None = None) -> None:
        super().__init__(message, code)
        self.wait_ms = wait_ms


class PeerGoneError(RemoteError):
    """The peer closed, died or stalled while serving us."""

    code = ErrorCode.PEER_GONE




class ContextLengthError(RemoteError):
    """The prompt plus the tokens asked for do not fit the model's context; says both numbers."""

    code = ErrorCode.CONTEXT_LENGTH_EXCEEDED

    def __init__(self, message: str, *, prompt_tokens: int, max_tokens: int, context: int) -> None:
        super().__init__(message)
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.context = context


class UnknownModelError(RemoteError):
    """No node of the mesh serves the model the request names."""

    code = ErrorCode.NO_MODEL
