"""Framing and message codec of every meshd protocol (see ``proto/README.md``).

A frame is a 4-byte big-endian body length followed by a msgpack map. The map's key ``"t"`` is
the message type id from the registry in ``meshd.core.messages``; the other keys are that
message's fields. Decoding checks the length against a hard cap *before* buffering the body,
unpacks with msgpack's own size limits, then checks the schema. Any bad input raises
``ProtocolError`` and nothing else (a Hypothesis test holds us to it).

``FrameDecoder`` is a sans-I/O buffer: feed it bytes as they arrive, take whole messages out.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any

import msgpack

from meshd.core.messages import REGISTRY, MessageType, check_fields
from meshd.errors import ProtocolError

HEADER = struct.Struct(">I")
HEADER_BYTES = HEADER.size

# Hard caps on one frame's body, by protocol. A stage frame carries activations.
MAX_CONTROL_FRAME = 1 << 20
MAX_REQUEST_FRAME = 1 << 20
MAX_STAGE_FRAME = 16 << 20
MAX_ADVERT_BYTES = 8 << 10
MAX_REVOCATION_BYTES = 256 << 10

Message = dict[str, Any]


def _unpack(body: bytes, max_bytes: int) -> Any:
    try:
        return msgpack.unpackb(
            body,
            raw=False,
            strict_map_key=True,
            max_str_len=max_bytes,
            max_bin_len=max_bytes,
            max_array_len=1 << 16,
            max_map_len=1 << 12,
            max_ext_len=0,
        )
    except (ValueError, TypeError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as e:
        raise ProtocolError(f"undecodable msgpack body: {type(e).__name__}") from None
    except Exception as e:  # msgpack raises a few more internal types on garbage
        raise ProtocolError(f"undecodable msgpack body: {type(e).__name__}") from None


def pack(obj: Any) -> bytes:
    """msgpack-encode a plain value (maps, lists, str, bytes, numbers)."""
    data: bytes = msgpack.packb(obj, use_bin_type=True)
    return data


def unpack(body: bytes, max_bytes: int) -> Any:
    """msgpack-decode with caps; ``ProtocolError`` on anything wrong."""
    if len(body) > max_bytes:
        raise ProtocolError(f"body of {len(body)} bytes exceeds the {max_bytes}-byte limit")
    return _unpack(body, max_bytes)


def encode_message(mtype: MessageType, fields: dict[str, Any]) -> bytes:
    """One message as a frame body (no length prefix). Validates our own output too."""
    msg = {"t": int(mtype), **fields}
    check_fields(REGISTRY[int(mtype)], msg)
    return pack(msg)


def decode_message(body: bytes, max_bytes: int, allowed: frozenset[int] | None = None) -> Message:
    """Decode and schema-check one frame body. ``allowed`` limits the types a protocol accepts."""
    obj = unpack(body, max_bytes)
    if not isinstance(obj, dict):
        raise ProtocolError("a message must be a msgpack map")
    t = obj.get("t")
    if not isinstance(t, int) or isinstance(t, bool):
        raise ProtocolError("message has no integer type 't'")
    spec = REGISTRY.get(t)
    if spec is None:
        raise ProtocolError(f"unknown message type {t}")
    if allowed is not None and t not in allowed:
        raise ProtocolError(f"message type {spec.name} is not allowed on this protocol")
    check_fields(spec, obj)
    return obj


def frame(mtype: MessageType, fields: dict[str, Any]) -> bytes:
    """A whole frame: length prefix plus body."""
    body = encode_message(mtype, fields)
    return HEADER.pack(len(body)) + body


class FrameDecoder:
    """Incremental frame splitter with a per-frame cap; sans I/O.

    >>> d = FrameDecoder(1024)
    >>> d.feed(frame(MessageType.PING, {"n": 1}))
    >>> [m["n"] for m in d.messages()]
    [1]
    """

    def __init__(self, max_frame: int, allowed: frozenset[int] | None = None) -> None:
        self._buf = bytearray()
        self._max = max_frame
        self._allowed = allowed

    def feed(self, data: bytes) -> None:
        self._buf += data
        if len(self._buf) >= HEADER_BYTES:
            (n,) = HEADER.unpack_from(self._buf)
            if n > self._max:
                raise ProtocolError(f"frame of {n} bytes exceeds the {self._max}-byte limit")

    def messages(self) -> Iterator[Message]:
        while len(self._buf) >= HEADER_BYTES:
            (n,) = HEADER.unpack_from(self._buf)
            if n > self._max:
                raise ProtocolError(f"frame of {n} bytes exceeds the {self._max}-byte limit")
            if len(self._buf) < HEADER_BYTES + n:
                return
            body = bytes(self._buf[HEADER_BYTES : HEADER_BYTES + n])
            del self._buf[: HEADER_BYTES + n]
            yield decode_message(body, self._max, self._allowed)

    @property
    def pending_bytes(self) -> int:
        return len(self._buf)
