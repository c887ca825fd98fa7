"""The key/value metadata of a GGUF file, as plain Python values.

GGUF (versions 2 and 3, little-endian) starts with the magic ``GGUF``, a uint32 version, the
uint64 counts of tensors and of metadata pairs, then the pairs: a string key, a uint32 value
type and the value. Strings are a uint64 byte length and UTF-8 bytes; arrays are a uint32
element type, a uint64 count and the elements. Only that head of the file is read (8 MiB, more
while the pairs run on); the tensor infos and the tensor data after it are not touched.

This reader exists beside the ``gguf`` package's ``GGUFReader`` because that one builds numpy
views per array element: 15 s for SmolLM2's 49,152-token vocabulary and about a minute for
Gemma 3's 262,144 tokens, against well under a second here. ``parse_metadata`` is the pure
part (bytes in, dict out); ``read_gguf_metadata`` opens the file.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import numpy as np

from meshd.errors import ModelError

MAGIC = b"GGUF"
VERSIONS = (2, 3)
MAX_COUNT = 1 << 32  # no GGUF holds more pairs or array elements than this
FIRST_READ_BYTES = 8 << 20

# value type -> numpy dtype of a fixed-size scalar (7 = bool, 8 = string, 9 = array)
_SCALARS = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4",
            10: "<u8", 11: "<i8", 12: "<f8"}
BOOL, STRING, ARRAY = 7, 8, 9


class Truncated(ValueError):
    """The bytes end before the metadata does."""


class _Cursor:
    def __init__(self, buf: memoryview) -> None:
        self.buf = buf
        self.pos = 0

    def take(self, n: int) -> memoryview:
        if n < 0 or self.pos + n > len(self.buf):
            raise Truncated(f"truncated at byte {self.pos}")
        out = self.buf[self.pos:self.pos + n]
        self.pos += n
        return out

    def u32(self) -> int:
        return int(struct.unpack("<I", self.take(4))[0])

    def u64(self) -> int:
        return int(struct.unpack("<Q", self.take(8))[0])

    def string(self) -> str:
        return str(self.take(self.u64()), "utf-8", "replace")

    def count(self) -> int:
        n = self.u64()
        if n > MAX_COUNT:
            raise ValueError(f"a count of {n} at byte {self.pos - 8}")
        return n

    def value(self, vtype: int) -> Any:
        if vtype in _SCALARS:
            dtype = np.dtype(_SCALARS[vtype])
            return np.frombuffer(self.take(dtype.itemsize), dtype)[0].item()
        if vtype == BOOL:
            return bool(self.take(1)[0])
        if vtype == STRING:
            return self.string()
        if vtype == ARRAY:
            etype, n = self.u32(), self.count()
            if etype in _SCALARS:
                dtype = np.dtype(_SCALARS[etype])
                return np.frombuffer(self.take(n * dtype.itemsize), dtype).tolist()
            if etype == BOOL:
                return [bool(b) for b in self.take(n)]
            return [self.value(etype) for _ in range(n)]
        raise ValueError(f"unknown value type {vtype} at byte {self.pos - 4}")


def parse_metadata(buf: bytes) -> dict[str, Any]:
    """The metadata pairs at the start of a GGUF file's bytes ``buf`` (the whole file or any
    prefix that holds them); ``Truncated`` when ``buf`` ends first, ValueError when they are
    not GGUF metadata."""
    cur = _Cursor(memoryview(buf))
    if bytes(cur.take(4)) != MAGIC:
        raise ValueError("no GGUF magic")
    version = cur.u32()
    if version not in VERSIONS:
        raise ValueError(f"GGUF version {version} (meshd reads {VERSIONS[0]} and {VERSIONS[1]}; "
                         "a big-endian file reads as a huge version)")
    cur.u64()  # tensor count
    out: dict[str, Any] = {}
    for _ in range(cur.count()):
        key = cur.string()
        out[key] = cur.value(cur.u32())
    return out


def read_gguf_metadata(path: Path | str) -> dict[str, Any]:
    """The key/value metadata of the GGUF file at ``path`` (str, int, float, bool and lists of
    them); a ``ModelError`` naming the file when it is not a GGUF file this reader knows."""
    name = Path(path).name
    size = FIRST_READ_BYTES
    try:
        with open(path, "rb") as f:
            while True:
                f.seek(0)
                head = f.read(size)
                try:
                    return parse_metadata(head)
                except Truncated:
                    if len(head) < size:  # the whole file was read
                        raise
                size *= 4
    except ValueError as err:
        raise ModelError(f"{name}: not a readable GGUF file ({err})") from None
    except OSError as err:
        raise ModelError(f"{name}: cannot read ({err.strerror or err})") from None
