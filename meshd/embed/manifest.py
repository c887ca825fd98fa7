"""``manifest.json`` of a meshd embedding model directory (format ``meshd-embedding``, 1).

The directory holds ``weights.bin`` (the same 64-byte-aligned tensor file as a generative
model, see docs/model-format.md), ``tokenizer.json`` and ``encoder.onnx`` (the whole encoder,
its initializers external references into ``weights.bin``), and, when the optional ``int8``
section names it, ``encoder-int8.onnx`` (meshd.embed.quantize; older readers ignore the
section). The format is in docs/embeddings.md; bump ``FORMAT_VERSION`` for any change an
older reader would misread.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from meshd.embed.arch import BertArch
from meshd.errors import ModelError
from meshd.modeldir.manifest import (
    MANIFEST,
    TensorEntry,
    check_file_names,
    check_tensors,
    manifest_format,
    parse_tensors,
    read_manifest_json,
    write_manifest,
)

FORMAT = "meshd-embedding"
FORMAT_VERSION = 1
DTYPES = ("fp32", "fp16")  # of the model and of each tensor


@dataclass(frozen=True, slots=True)
class EmbedManifest:
    name: str
    version: str
    arch: BertArch
    dtype: str
    weights_file: str
    weights_bytes: int
    weights_sha256: str
    tensors: tuple[TensorEntry, ...]
    tokenizer_file: str
    tokenizer_sha256: str
    graph_file: str
    graph_sha256: str
    source: dict[str, Any] = field(default_factory=dict)
    created_by: str = ""
    int8_file: str = ""  # the int8 graph (meshd.embed.quantize), "" when there is none
    int8_sha256: str = ""
    int8_scheme: str = ""

    @property
    def content_hash(self) -> str:
        """The identity of the model: the sha256 of its weights file."""
        return self.weights_sha256

    @property
    def identity(self) -> str:
        """``name@sha256-prefix``: what caches key embeddings by."""
        return f"{self.name}@{self.weights_sha256[:16]}"

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "name": self.name,
            "version": self.version,
            "created_by": self.created_by,
            "source": self.source,
            "architecture": self.arch.to_json(),
            "dtype": self.dtype,
            "weights": {"file": self.weights_file, "bytes": self.weights_bytes,
                        "sha256": self.weights_sha256,
                        "tensors": [t.to_json() for t in self.tensors]},
            "tokenizer": {"file": self.tokenizer_file, "sha256": self.tokenizer_sha256},
            "graph": {"file": self.graph_file, "sha256": self.graph_sha256},
            **({"int8": {"file": self.int8_file, "sha256": self.int8_sha256,
                         "scheme": self.int8_scheme}} if self.int8_file else {}),
        }

    def write(self, directory: Path) -> None:
        write_manifest(directory, self.to_json())


def is_embedding_dir(directory: Path) -> bool:
    """Whether ``directory`` holds an embedding model (and not a generative one)."""
    return manifest_format(directory) == FORMAT


def read_embed_manifest(directory: Path) -> EmbedManifest:
    return parse_embed_manifest(*read_manifest_json(directory))


def parse_embed_manifest(data: Any, source: str = MANIFEST) -> EmbedManifest:
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ModelError(f"{source}: not a meshd embedding model manifest (field 'format')")
    if data.get("format_version") != FORMAT_VERSION:
        raise ModelError(f"{source}: format_version={data.get('format_version')!r} is not "
                         f"supported (this meshd reads {FORMAT_VERSION})")
    try:
        w, tok, graph = data["weights"], data["tokenizer"], data["graph"]
        int8 = data.get("int8") or {}
        m = EmbedManifest(
            name=str(data["name"]),
            version=str(data["version"]),
            arch=BertArch.from_json(data["architecture"], source),
            dtype=str(data["dtype"]),
            weights_file=str(w["file"]),
            weights_bytes=int(w["bytes"]),
            weights_sha256=str(w["sha256"]),
            tensors=parse_tensors(w["tensors"]),
            tokenizer_file=str(tok["file"]),
            tokenizer_sha256=str(tok["sha256"]),
            graph_file=str(graph["file"]),
            graph_sha256=str(graph["sha256"]),
            source=dict(data.get("source", {})),
            created_by=str(data.get("created_by", "")),
            int8_file=str(int8.get("file", "")),
            int8_sha256=str(int8.get("sha256", "")),
            int8_scheme=str(int8.get("scheme", "")),
        )
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as err:
        raise ModelError(f"{source}: malformed manifest ({type(err).__name__}: {err})") from None
    if m.dtype not in DTYPES:
        raise ModelError(f"{source}: dtype={m.dtype!r} is not supported (fp32, fp16)")
    check_tensors(source, m.tensors, DTYPES, m.weights_file, m.weights_bytes)
    check_file_names(source, (m.weights_file, m.tokenizer_file, m.graph_file,
                              *filter(None, [m.int8_file])))
    return m
