"""Token ids on the wire, packed: little-endian ``u16`` or ``u32`` by vocabulary size.

A forwarded request (REQ) and a pipeline's last stage (STAGE_OPEN) carry the prompt as token ids
in one binary field, ``prompt_packed``, with its element type in ``prompt_dtype``: ``u16`` when
every id of the vocabulary fits in 16 bits (a vocabulary of at most 65,536 entries), ``u32``
otherwise. Two or four bytes a token, where a msgpack list of ints costs up to three or five and
the text costs about four bytes a token in English and more in other scripts.

``unpack_ids`` is what a receiver calls on those bytes: it raises ``ProtocolError`` (code
``malformed``) for an unknown dtype, a byte count that is not a whole number of ids, no ids at
all, too many, or an id outside the receiver's vocabulary. Pure: bytes in, ints out.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from meshd.core.advert import Advert
from meshd.errors import ProtocolError

ITEM_BYTES = {"u16": 2, "u32": 4}
_CODE = {"u16": "H", "u32": "I"}
MAX_PACKED_IDS = 1 << 20  # ids in one field; a request frame (1 MiB) holds far fewer anyway


def dtype_for(vocab_size: int) -> str:
    """The element type for ids of a vocabulary of ``vocab_size`` entries."""
    return "u16" if vocab_size <= 1 << 16 else "u32"


def pack_ids(ids: Sequence[int], vocab_size: int) -> tuple[str, bytes]:
    """``(dtype, data)`` of ``ids``. Raises ``ValueError`` for an id outside
    ``[0, vocab_size)`` (our own bug: the ids came from our tokenizer or our model)."""
    if vocab_size < 1 or vocab_size > 1 << 32:
        raise ValueError(f"vocabulary size {vocab_size} cannot be packed")
    for i in ids:
        if not 0 <= i < vocab_size:
            raise ValueError(f"token id {i} is outside the vocabulary [0, {vocab_size})")
    dtype = dtype_for(vocab_size)
    return dtype, struct.pack(f"<{len(ids)}{_CODE[dtype]}", *ids)


def unpack_ids(data: object, dtype: object, vocab_size: int | None) -> list[int]:
    """The ids in ``data``, checked: ``dtype`` is ``u16`` or ``u32``, the length a whole number of
    ids (at least one, at most ``MAX_PACKED_IDS``), every id below ``vocab_size`` (when the
    receiver knows it). Raises only ``ProtocolError``."""
    if dtype not in ITEM_BYTES:
        raise ProtocolError(f"prompt_dtype must be u16 or u32, not {str(dtype)[:16]!r}")
    if not isinstance(data, bytes):
        raise ProtocolError("prompt_packed must be binary data")
    item = ITEM_BYTES[str(dtype)]
    if len(data) % item:
        raise ProtocolError(f"prompt_packed holds {len(data)} bytes: not a whole number of "
                            f"{dtype} token ids")
    n = len(data) // item
    if n == 0:
        raise ProtocolError("prompt_packed holds no token ids")
    if n > MAX_PACKED_IDS:
        raise ProtocolError(f"prompt_packed holds {n} token ids, over the {MAX_PACKED_IDS} limit")
    ids = list(struct.unpack(f"<{n}{_CODE[str(dtype)]}", data))
    if vocab_size is not None and max(ids) >= vocab_size:
        raise ProtocolError(f"prompt_packed has token id {max(ids)}, outside the vocabulary "
                            f"[0, {vocab_size})")
    return ids


def vocab_bound(ids: Sequence[int], vocab_size: int) -> int:
    """A vocabulary size that covers ``ids``: ``vocab_size`` (0: unknown), or more when an id is
    past it (a generated id of a model whose embedding is wider than its tokenizer)."""
    return max(vocab_size, max(ids, default=0) + 1, 1)


def takes_packed(advert: Advert | None, model: str) -> bool:
    """Whether the author of ``advert`` reads packed prompts for ``model``: nodes that advertise
    a tokenizer identity for it (protocol version 2) do; older ones get a list of ids."""
    return advert is not None and any(m.name == model and m.tokenizer for m in advert.models)
