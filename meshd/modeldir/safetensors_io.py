"""Read Hugging Face ``.safetensors`` files (single or sharded) without torch.

The format is an 8-byte little-endian header length, a JSON header mapping each tensor name to
its dtype, shape and byte range, then the raw data. We parse it ourselves so that bfloat16
checkpoints (which numpy cannot name) are read too, and so that a damaged file gets one clear
line naming it instead of a foreign traceback.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from meshd.errors import ModelError

MAX_HEADER_BYTES = 100 * 1024 * 1024
_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "F64": np.float64,
           "I64": np.int64}  # integer buffers (BERT's ``position_ids``) are listed, never imported


@dataclass(frozen=True, slots=True)
class TensorInfo:
    name: str
    dtype: str  # safetensors spelling: F32, F16, BF16, F64, I64
    shape: tuple[int, ...]
    start: int  # absolute byte offset in the file
    end: int


class SafetensorsFile:
    """One ``.safetensors`` file, memory-mapped; tensors are read on demand."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.tensors = _read_header(path)
        self._map: np.memmap | None = None

    def read(self, name: str) -> np.ndarray:
        """The tensor as float32 or float16 (bfloat16 and float64 become float32; int64 as is)."""
        info = self.tensors[name]
        if self._map is None:
            self._map = np.memmap(self.path, dtype=np.uint8, mode="r")
        raw = self._map[info.start:info.end]
        arr = raw.view(_DTYPES[info.dtype]).reshape(info.shape)
        if info.dtype == "BF16":
            return (arr.astype(np.uint32) << 16).view(np.float32)
        if info.dtype == "F64":
            return arr.astype(np.float32)
        return arr


def _read_header(path: Path) -> dict[str, TensorInfo]:
    where = path.name
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise ModelError(f"{where}: corrupt safetensors file (shorter than its header)")
            (n,) = struct.unpack("<Q", head)
            if n > MAX_HEADER_BYTES or 8 + n > size:
                raise ModelError(f"{where}: corrupt safetensors file (bad header length {n})")
            header = json.loads(f.read(n))
    except OSError as err:
        raise ModelError(f"{where}: cannot read ({err.strerror})") from None
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ModelError(f"{where}: corrupt safetensors file (header is not JSON)") from None
    if not isinstance(header, dict):
        raise ModelError(f"{where}: corrupt safetensors file (header is not an object)")
    base = 8 + n
    out: dict[str, TensorInfo] = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype = meta["dtype"]
            shape = tuple(int(d) for d in meta["shape"])
            begin, end = (int(x) for x in meta["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise ModelError(f"{where}: corrupt safetensors entry for {name!r}") from None
        if dtype not in _DTYPES:
            raise ModelError(f"{where}: tensor {name!r} has unsupported dtype {dtype}")
        itemsize = 2 if dtype == "BF16" else np.dtype(_DTYPES[dtype]).itemsize
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if end - begin != count * itemsize or begin < 0 or base + end > size:
            raise ModelError(
                f"{where}: corrupt safetensors file (tensor {name!r} lies outside the data "
                "or has the wrong byte length; truncated download?)"
            )
        out[name] = TensorInfo(name, dtype, shape, base + begin, base + end)
    return out


class Checkpoint:
    """Every tensor of a checkpoint directory: ``model.safetensors`` or a sharded index."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.files: dict[str, SafetensorsFile] = {}
        self.where: dict[str, SafetensorsFile] = {}
        single = directory / "model.safetensors"
        index = directory / "model.safetensors.index.json"
        if single.is_file():
            f = SafetensorsFile(single)
            self.files[single.name] = f
            self.where = dict.fromkeys(f.tensors, f)
        elif index.is_file():
            self._read_index(index)
        else:
            raise ModelError(
                f"{directory}: no weights (expected model.safetensors or "
                "model.safetensors.index.json)"
            )

    def _read_index(self, index: Path) -> None:
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            if not isinstance(weight_map, dict):
                raise TypeError
        except (OSError, ValueError, KeyError, TypeError):
            raise ModelError(f"{index.name}: corrupt index (no 'weight_map' object)") from None
        for name, shard in sorted(weight_map.items()):
            if shard not in self.files:
                path = self.directory / shard
                if "/" in shard or not path.is_file():
                    raise ModelError(f"{index.name}: shard {shard!r} is missing")
                self.files[shard] = SafetensorsFile(path)
            f = self.files[shard]
            if name not in f.tensors:
                raise ModelError(f"{shard}: tensor {name!r} listed in {index.name} is missing")
            self.where[name] = f

    def __contains__(self, name: str) -> bool:
        return name in self.where

    def info(self, name: str) -> TensorInfo:
        return self.where[name].tensors[name]

    def source_of(self, name: str) -> str:
        return self.where[name].path.name

    def read(self, name: str) -> np.ndarray:
        return self.where[name].read(name)

    def names(self) -> Iterator[str]:
        return iter(sorted(self.where))
