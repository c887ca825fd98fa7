"""The single weights file of a model directory: written once by the importer, checked at load.

Tensors are stored back to back in Hugging Face layout, each starting on a ``ALIGN``-byte
boundary, in little-endian float32 or float16. The manifest lists each tensor's offset, length
and sha256; the whole file's sha256 is the model's content hash.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from meshd.engine.manifest import Manifest, TensorEntry
from meshd.engine.quant import Blockwise
from meshd.errors import ModelError

ALIGN = 64
_NP: dict[str, np.dtype[Any]] = {"fp32": np.dtype("<f4"), "fp16": np.dtype("<f2"),
                                 "q4": np.dtype("u1"), "q8": np.dtype("u1"), "u8": np.dtype("u1")}


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

    def add_blockwise(self, name: str, b: Blockwise) -> None:
        """A 4/8-bit matrix: its codes as ``name``, then its scales, zero points and minimums
        (meshd.engine.manifest.QUANT_PARTS)."""
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


def verify_weights(directory: Path, manifest: Manifest, names: Iterable[str]) -> None:
    """Check the weights file's size and the sha256 of each named tensor (what a stage reads);
    raise ``ModelError`` naming the tensor on a mismatch."""
    path = directory / manifest.weights_file
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise ModelError(f"{path}: weights file is missing") from None
    if size != manifest.weights_bytes:
        raise ModelError(
            f"{path}: size {size} bytes, manifest says "
            f"{manifest.weights_bytes} (truncated or replaced?)"
        )
    wanted = set(manifest.stored_names(names))
    with path.open("rb") as f:
        for t in manifest.tensors:
            if t.name not in wanted:
                continue
            f.seek(t.offset)
            if hashlib.sha256(f.read(t.nbytes)).hexdigest() != t.sha256:
                raise ModelError(
                    f"{path}: hash mismatch in tensor {t.name!r} "
                    "(the file is corrupt or does not belong to this manifest)"
                )
    missing = wanted - {t.name for t in manifest.tensors}
    if missing:
        raise ModelError(f"{directory / 'manifest.json'}: tensor {sorted(missing)[0]!r} is not listed")


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
