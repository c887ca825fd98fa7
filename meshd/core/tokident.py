"""A tokenizer's identity, and the bundle one node hands another (docs/edge-tokenization.md).

What decides how a prompt becomes token ids is the ``tokenizer.json`` file and, for chat
requests, the chat template with the BOS/EOS tokens it writes. The **tokenizer identity** is a
sha256 over exactly those:

    sha256("meshd-tokenizer-v1\\0" || sha256(tokenizer.json) || msgpack([bos_token_id,
           eos_token_ids, bos_token, eos_token, chat_template]))

as 64 lowercase hex digits. Adverts carry it per model (``tok``); a request tokenized at the
entry names it (``tok``: its first 16 hex digits, 64 bits, enough to tell tokenizers apart and
48 bytes fewer on every request), so an entry node and a serving node can never disagree on the
ids.

A **bundle** is what travels (TOK_PART frames, in chunks under the request frame cap) and what
an entry node caches on disk: a msgpack map ``{"v": 1, "json": <tokenizer.json bytes>, "meta":
[the five values above]}``. ``decode_bundle`` recomputes the identity from the bytes received
and refuses a bundle whose identity is not the one asked for. ``Assembler`` puts chunks back
together. Pure: bytes in, bytes or a ``ProtocolError`` out.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from meshd.core.wire import pack, unpack
from meshd.errors import ProtocolError

DOMAIN = b"meshd-tokenizer-v1\0"
BUNDLE_VERSION = 1
MAX_BUNDLE_BYTES = 64 << 20  # the largest tokenizers in use are ~35 MB of JSON
CHUNK_BYTES = 512 << 10  # one TOK_PART's data: well under the 1 MiB request-frame cap
_HEX64 = re.compile(r"[0-9a-f]{64}")
_HEX = re.compile(r"[0-9a-f]{16,64}")
SHORT_ID_CHARS = 16  # what a request names of the identity


class BundleMismatch(ProtocolError):
    """A tokenizer bundle whose content hash is not the identity asked for (tampered, corrupt,
    or another tokenizer): it is refused and never cached."""


@dataclass(frozen=True, slots=True)
class TokenizerMeta:
    """What besides ``tokenizer.json`` decides a chat prompt's ids (docs/model-format.md)."""

    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    bos_token: str | None = None
    eos_token: str | None = None
    chat_template: str | None = None

    def as_list(self) -> list[Any]:
        return [self.bos_token_id, list(self.eos_token_ids), self.bos_token, self.eos_token,
                self.chat_template]


def is_identity(value: object) -> bool:
    """Whether ``value`` is a tokenizer identity this version understands."""
    return isinstance(value, str) and _HEX64.fullmatch(value) is not None


def short_id(identity: str) -> str:
    """The part of an identity a request carries (``tok`` of REQ and STAGE_OPEN)."""
    return identity[:SHORT_ID_CHARS]


def names(tok: object, identity: str) -> bool:
    """Whether a request's ``tok`` names ``identity``. ``ProtocolError`` when ``tok`` is not 16
    to 64 lowercase hex digits."""
    if not isinstance(tok, str) or _HEX.fullmatch(tok) is None:
        raise ProtocolError("tok must be 16 to 64 lowercase hex digits of a tokenizer identity")
    return identity.startswith(tok)


def tokenizer_identity(tokenizer_json: bytes, meta: TokenizerMeta) -> str:
    h = hashlib.sha256(DOMAIN)
    h.update(hashlib.sha256(tokenizer_json).digest())
    h.update(pack(meta.as_list()))
    return h.hexdigest()


def encode_bundle(tokenizer_json: bytes, meta: TokenizerMeta) -> bytes:
    return pack({"v": BUNDLE_VERSION, "json": tokenizer_json, "meta": meta.as_list()})


def _meta(v: Any) -> TokenizerMeta:
    if not isinstance(v, list) or len(v) != 5:
        raise ProtocolError("tokenizer bundle: meta must be a list of 5 values")
    bos_id, eos_ids, bos, eos, template = v
    if bos_id is not None and (not isinstance(bos_id, int) or isinstance(bos_id, bool)):
        raise ProtocolError("tokenizer bundle: bos_token_id must be an integer or nil")
    if not isinstance(eos_ids, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) for i in eos_ids):
        raise ProtocolError("tokenizer bundle: eos_token_ids must be a list of integers")
    for name, s in (("bos_token", bos), ("eos_token", eos), ("chat_template", template)):
        if s is not None and not isinstance(s, str):
            raise ProtocolError(f"tokenizer bundle: {name} must be a string or nil")
    return TokenizerMeta(bos_id, tuple(eos_ids), bos, eos, template)


def decode_bundle(data: bytes, identity: str) -> tuple[bytes, TokenizerMeta]:
    """``(tokenizer.json bytes, meta)`` of a bundle, whose identity must be ``identity``.
    Raises only ``ProtocolError`` (malformed, or "hash mismatch": not the tokenizer asked for)."""
    if len(data) > MAX_BUNDLE_BYTES:
        raise ProtocolError(f"tokenizer bundle of {len(data)} bytes exceeds {MAX_BUNDLE_BYTES}")
    d = unpack(data, MAX_BUNDLE_BYTES)
    if not isinstance(d, dict) or d.get("v") != BUNDLE_VERSION:
        raise ProtocolError("tokenizer bundle: not a version 1 bundle")
    body = d.get("json")
    if not isinstance(body, bytes) or not body:
        raise ProtocolError("tokenizer bundle: json must be non-empty binary data")
    meta = _meta(d.get("meta"))
    got = tokenizer_identity(body, meta)
    if got != identity:
        raise BundleMismatch(f"tokenizer bundle hash mismatch: asked for {identity[:12]}, "
                             f"the bytes are {got[:12]}")
    return body, meta


def chunks(bundle: bytes, size: int = CHUNK_BYTES) -> Iterator[tuple[int, bytes]]:
    """``(offset, data)`` pieces of ``bundle``, in order (one empty piece for an empty one)."""
    if not bundle:
        yield 0, b""
        return
    for off in range(0, len(bundle), size):
        yield off, bundle[off:off + size]


class Assembler:
    """Chunks in (each with its offset and the total), the whole bundle out; sans I/O.

    >>> a = Assembler()
    >>> a.feed(0, 5, b"abc"), a.feed(3, 5, b"de")
    (None, b'abcde')
    """

    def __init__(self, max_bytes: int = MAX_BUNDLE_BYTES) -> None:
        self._buf = bytearray()
        self._total: int | None = None
        self._max = max_bytes

    def feed(self, offset: int, total: int, data: bytes) -> bytes | None:
        """Take one chunk; the bundle once it is complete, else None. ``ProtocolError`` for a
        chunk out of order, a total that changes or is over the cap, or too many bytes."""
        if not 0 < total <= self._max:
            raise ProtocolError(f"tokenizer bundle of {total} bytes: outside (0, {self._max}]")
        if self._total is None:
            self._total = total
        elif total != self._total:
            raise ProtocolError("tokenizer bundle: the total changed between chunks")
        if offset != len(self._buf):
            raise ProtocolError(f"tokenizer bundle: chunk at {offset}, expected {len(self._buf)}")
        if len(self._buf) + len(data) > total:
            raise ProtocolError("tokenizer bundle: more bytes than its total")
        self._buf += data
        return bytes(self._buf) if len(self._buf) == total else None
