"""What every model folder's ``manifest.json`` shares: the weights file's tensor list, plain file
names, reading the JSON and writing it atomically with one line per tensor.

Each kind of model has its own manifest class and ``format`` (``meshd.engine.manifest``:
``meshd-model``; ``meshd.embed.manifest``: ``meshd-embedding``); they parse and check their
``weights`` section and file names with the functions here.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from meshd.errors import ModelError

MANIFEST = "manifest.json"


@dataclass(frozen=True, slots=True)
class TensorEntry:
    """One tensor in the weights file: stored in Hugging Face layout and naming."""

    name: str
    dtype: str  # a storage dtype the model's kind allows (fp32, fp16, q4, q8, u8)
    shape: tuple[int, ...]
    offset: int
    nbytes: int
    sha256: str

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape),
                "offset": self.offset, "nbytes": self.nbytes, "sha256": self.sha256}


def parse_tensors(rows: Any) -> tuple[TensorEntry, ...]:
    """The ``weights.tensors`` rows as entries (a ``KeyError``/``TypeError``/``ValueError`` on a
    malformed row: the caller names the manifest)."""
    return tuple(TensorEntry(t["name"], t["dtype"], tuple(int(s) for s in t["shape"]),
                             int(t["offset"]), int(t["nbytes"]), str(t["sha256"]))
                 for t in rows)


def check_tensors(source: str, tensors: Iterable[TensorEntry], dtypes: Iterable[str],
                  weights_file: str, weights_bytes: int) -> None:
    """Every tensor has a dtype of ``dtypes`` and lies inside the weights file."""
    allowed = tuple(dtypes)
    for t in tensors:
        if t.dtype not in allowed:
            raise ModelError(f"{source}: tensor {t.name!r} has unsupported dtype {t.dtype!r}")
        if t.offset < 0 or t.offset + t.nbytes > weights_bytes:
            raise ModelError(f"{source}: tensor {t.name!r} lies outside {weights_file}")


def check_file_names(source: str, names: Iterable[str]) -> None:
    """The files a manifest names are plain names inside its folder."""
    for name in names:
        if "/" in name or "\\" in name or name.startswith("."):
            raise ModelError(f"{source}: file name {name!r} must be a plain name in the directory")


def read_manifest_json(directory: Path) -> tuple[Any, str]:
    """The parsed ``manifest.json`` of a model directory and its path, or ``ModelError`` saying
    why not (no such file, unreadable, not JSON)."""
    path = directory / MANIFEST
    try:
        return json.loads(path.read_text()), str(path)
    except FileNotFoundError:
        raise ModelError(f"{directory}: not a meshd model directory (no {MANIFEST})") from None
    except OSError as err:
        raise ModelError(f"{path}: cannot read ({err.strerror})") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ModelError(f"{path}: not valid JSON ({err})") from None


def manifest_format(directory: Path) -> str | None:
    """The ``format`` a folder's manifest declares (None: no readable manifest)."""
    try:
        data = json.loads((directory / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return data.get("format") if isinstance(data, dict) else None


def dumps_manifest(data: dict[str, Any]) -> str:
    """Indented JSON with one line per tensor (and per stage, where the manifest lists stages),
    so that diffs stay readable."""
    data = json.loads(json.dumps(data))
    compact: dict[str, str] = {}
    sections = [("tensors", data["weights"], "tensors", "  ")]
    if "stages" in data:
        sections.append(("stages", data, "stages", " "))
    for key, holder, field, pad in sections:
        rows = holder[field]
        marker = f"@@{key}@@"
        lines = ",\n".join(f"{pad} {json.dumps(row)}" for row in rows)
        compact[json.dumps(marker)] = f"[\n{lines}\n{pad}]" if rows else "[]"
        holder[field] = marker
    text = json.dumps(data, indent=1)
    for marker, value in compact.items():
        text = text.replace(marker, value)
    return text + "\n"


def write_manifest(directory: Path, data: dict[str, Any]) -> None:
    """Write ``manifest.json`` whole: a reader never sees half a manifest."""
    part = directory / f".{MANIFEST}.{os.getpid()}"
    part.write_text(dumps_manifest(data))
    os.replace(part, directory / MANIFEST)
