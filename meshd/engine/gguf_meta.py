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
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from meshd.errors import ModelError

T = TypeVar("T")
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
    return _read_head(path, parse_metadata)


def _read_head(path: Path | str, parse: Callable[[bytes], T]) -> T:
    """``parse`` of the head of the file at ``path``, read in growing pieces until it holds
    what ``parse`` needs (it raises ``Truncated`` until then)."""
    name = Path(path).name
    size = FIRST_READ_BYTES
    try:
        with open(path, "rb") as f:
            while True:
                f.seek(0)
                head = f.read(size)
                try:
                    return parse(head)
                except Truncated:
                    if len(head) < size:  # the whole file was read
                        raise
                size *= 4
    except ValueError as err:
        raise ModelError(f"{name}: not a readable GGUF file ({err})") from None
    except OSError as err:
        raise ModelError(f"{name}: cannot read ({err.strerror or err})") from None

# GGML tensor types: id -> (name, values per block, bytes per block). The names meshd reads
# are in meshd.engine.quant; the rest are here only to be named when refused.
GGML_TYPES = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 36),
    10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50), 20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136), 24: ("I8", 1, 1), 25: ("I16", 1, 2),
    26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8), 29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66),
}
DEFAULT_ALIGNMENT = 32


class TensorInfo:
    """One tensor of a GGUF file: its name, GGML type, shape in ggml order (the row length
    first) and where its bytes lie from the start of the file."""

    __slots__ = ("name", "type_name", "shape", "start", "nbytes")

    def __init__(self, name: str, type_name: str, shape: tuple[int, ...], start: int,
                 nbytes: int) -> None:
        self.name, self.type_name, self.shape = name, type_name, shape
        self.start, self.nbytes = start, nbytes


def parse_gguf(buf: bytes) -> tuple[dict[str, Any], list[TensorInfo]]:
    """The metadata and the tensor infos of a GGUF file whose head is ``buf``; ``Truncated``
    when ``buf`` ends before the tensor infos do."""
    cur = _Cursor(memoryview(buf))
    if bytes(cur.take(4)) != MAGIC:
        raise ValueError("no GGUF magic")
    version = cur.u32()
    if version not in VERSIONS:
        raise ValueError(f"GGUF version {version} (meshd reads {VERSIONS[0]} and {VERSIONS[1]})")
    n_tensors = cur.count()
    meta: dict[str, Any] = {}
    for _ in range(cur.count()):
        key = cur.string()
        meta[key] = cur.value(cur.u32())
    raw = []
    for _ in range(n_tensors):
        name = cur.string()
        dims = tuple(cur.u64() for _ in range(cur.u32()))
        gtype, offset = cur.u32(), cur.u64()
        raw.append((name, dims, gtype, offset))
    align = int(meta.get("general.alignment", DEFAULT_ALIGNMENT)) or DEFAULT_ALIGNMENT
    data_start = -(-cur.pos // align) * align
    tensors = []
    for name, dims, gtype, offset in raw:
        type_name, block, size = GGML_TYPES.get(gtype, (f"GGML type {gtype}", 0, 0))
        n = int(np.prod(dims)) if dims else 1
        nbytes = n // block * size if block else 0
        tensors.append(TensorInfo(name, type_name, dims, data_start + offset, nbytes))
    return meta, tensors


def read_gguf(path: Path | str) -> tuple[dict[str, Any], list[TensorInfo]]:
    """``parse_gguf`` of the file at ``path``, reading only as much of its head as it needs;
    a ``ModelError`` naming the file when it is not a GGUF file this reader knows."""
    return _read_head(path, parse_gguf)
