"""The single weights file of a model folder, written once by an importer.

Tensors are stored back to back in Hugging Face layout, each starting on an ``ALIGN``-byte
boundary, little-endian: float32, float16, or 4/8-bit block codes with their scales, zero points
and minimums (``meshd.engine.quant``). The manifest lists each tensor's offset, length and
sha256; the whole file's sha256 is the model's content hash.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, BinaryIO, Protocol

import numpy as np

from meshd.modeldir.manifest import TensorEntry

ALIGN = 64
_NP: dict[str, np.dtype[Any]] = {"fp32": np.dtype("<f4"), "fp16": np.dtype("<f2"),
                                 "q4": np.dtype("u1"), "q8": np.dtype("u1"), "u8": np.dtype("u1")}


class Blocks(Protocol):
    """A matrix in 4/8-bit blocks (``meshd.engine.quant.Blockwise``)."""

    @property
    def bits(self) -> int: ...
    @property
    def q(self) -> np.ndarray: ...
    @property
    def scales(self) -> np.ndarray: ...
    @property
    def zero_points(self) -> np.ndarray: ...
    @property
    def mins(self) -> np.ndarray | None: ...


class WeightsWriter:
    """Append tensors to an open weights file, tracking offsets and hashes."""

    def __init__(self, f: BinaryIO) -> None:
        self._f = f
        self._offset = 0
        self._file_hash = hashlib.sha256()
        self.entries: list[TensorEntry] = []

    def add(self, name: str, array: np.ndarray, dtype: str) -> TensorEntry:
        data = np.ascontiguousarray(array, dtype=_NP[dtype]).tobytes()
        pad = (-self._offset) % ALIGN
        if pad:
            self._write(b"\0" * pad)
        entry = TensorEntry(name, dtype, tuple(int(s) for s in array.shape), self._offset,
                            len(data), hashlib.sha256(data).hexdigest())
        self._write(data)
        self.entries.append(entry)
        return entry

    def add_blockwise(self, name: str, b: Blocks) -> None:
        """A 4/8-bit matrix: its codes as ``name``, then its scales, zero points and minimums
        (meshd.engine.planning.QUANT_PARTS)."""
        self.add(name, b.q, "q4" if b.bits == 4 else "q8")
        self.add(name + ".scales", b.scales, "fp32")
        self.add(name + ".zero_points", b.zero_points, "u8")
        if b.mins is not None:
            self.add(name + ".mins", b.mins, "fp32")

    def _write(self, data: bytes) -> None:
        self._f.write(data)
        self._file_hash.update(data)
        self._offset += len(data)

    @property
    def nbytes(self) -> int:
        return self._offset

    @property
    def sha256(self) -> str:
        return self._file_hash.hexdigest()


def file_sha256(path: Path) -> str:
    """The sha256 of a file, read a megabyte at a time."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
