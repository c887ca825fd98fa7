"""``manifest.json`` of a meshd model directory: read, validate, write.

The format is documented in docs/model-format.md; bump ``FORMAT_VERSION`` for any change that an
older reader would misread. The tensor list, file names and writing are every model folder's
(``meshd.modeldir.manifest``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from meshd.engine.arch import Arch
from meshd.engine.planning import QUANT_PARTS
from meshd.errors import ModelError
from meshd.modeldir.manifest import (
    MANIFEST,
    TensorEntry,
    check_file_names,
    check_tensors,
    parse_tensors,
    read_manifest_json,
    write_manifest,
)

FORMAT = "meshd-model"
FORMAT_VERSION = 2  # 2: 4/8-bit block-quantized tensors; version 1 manifests still read
READS_VERSIONS = (1, 2)
# A model's dtype: how its weight matrices are stored (docs/model-format.md). int4 and int8
# models keep norms in float32 and may hold some matrices at 8 bits (an int4 GGUF's embedding).
DTYPES = ("fp32", "fp16", "int4", "int8")
# A tensor's dtype: floats, 4/8-bit block codes (meshd.engine.quant), or plain bytes (the
# codes' zero points)
TENSOR_DTYPES = ("fp32", "fp16", "q4", "q8", "u8")



@dataclass(frozen=True, slots=True)
class StageEntry:
    """A prebuilt stage graph: layers ``[start, end)`` in ``file``."""

    start: int
    end: int
    file: str
    sha256: str
    memory: dict[str, int]

    def to_json(self) -> dict[str, Any]:
        return {"layers": [self.start, self.end], "file": self.file, "sha256": self.sha256,
                "memory": self.memory}


@dataclass(frozen=True, slots=True)
class TokenizerInfo:
    file: str
    sha256: str
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    bos_token: str | None = None
    eos_token: str | None = None
    chat_template: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "sha256": self.sha256, "bos_token_id": self.bos_token_id,
                "eos_token_ids": list(self.eos_token_ids), "bos_token": self.bos_token,
                "eos_token": self.eos_token, "chat_template": self.chat_template}


@dataclass(frozen=True, slots=True)
class Manifest:
    name: str
    version: str
    arch: Arch
    dtype: str
    weights_file: str
    weights_bytes: int
    weights_sha256: str
    tensors: tuple[TensorEntry, ...]
    tokenizer: TokenizerInfo
    stages: tuple[StageEntry, ...] = ()
    source: dict[str, Any] = field(default_factory=dict)
    created_by: str = ""
    # the model's tier for ``model = "auto"`` requests (docs/tiers.md): "micro", "small" or
    # "large" ("" = none: only requests naming the model get it), and a relative quality figure
    tier: str = ""
    quality: float = 0.0

    @property
    def content_hash(self) -> str:
        """The identity of the weights: the sha256 of the weights file."""
        return self.weights_sha256

    def stored_bytes(self) -> dict[str, tuple[str, int]]:
        """Every stored tensor's (dtype, bytes), for ``planning.stage_memory``."""
        return {t.name: (t.dtype, t.nbytes) for t in self.tensors}

    def stored_names(self, names: Iterable[str]) -> list[str]:
        """``names`` with the companions of each 4/8-bit tensor (its scales, zero points and
        minimums), as stored."""
        listed = {t.name for t in self.tensors}
        out = []
        for name in names:
            out.append(name)
            out += [name + part for part in QUANT_PARTS if name + part in listed]
        return out

    def tensor(self, name: str) -> TensorEntry:
        for t in self.tensors:
            if t.name == name:
                return t
        raise ModelError(f"{MANIFEST}: tensor {name!r} is not listed")

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
            "tokenizer": self.tokenizer.to_json(),
            "stages": [s.to_json() for s in self.stages],
            **({"tier": {"tier": self.tier, "quality": self.quality}} if self.tier else {}),
        }

    def write(self, directory: Path) -> None:
        write_manifest(directory, self.to_json())


def read_manifest(directory: Path) -> Manifest:
    return parse_manifest(*read_manifest_json(directory))


def parse_manifest(data: Any, source: str = MANIFEST) -> Manifest:
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ModelError(f"{source}: not a meshd model manifest (field 'format')")
    if data.get("format_version") not in READS_VERSIONS:
        raise ModelError(
            f"{source}: format_version={data.get('format_version')!r} is not supported "
            f"(this meshd reads {', '.join(map(str, READS_VERSIONS))})"
        )
    try:
        w, tok = data["weights"], data["tokenizer"]
        dtype = data["dtype"]
        if dtype not in DTYPES:
            raise ModelError(f"{source}: dtype={dtype!r} is not supported ({', '.join(DTYPES)})")
        tensors = parse_tensors(w["tensors"])
        stages = tuple(
            StageEntry(int(s["layers"][0]), int(s["layers"][1]), str(s["file"]),
                       str(s["sha256"]), dict(s.get("memory", {})))
            for s in data.get("stages", [])
        )
        manifest = Manifest(
            name=str(data["name"]),
            version=str(data["version"]),
            arch=Arch.from_json(data["architecture"], source),
            dtype=dtype,
            weights_file=str(w["file"]),
            weights_bytes=int(w["bytes"]),
            weights_sha256=str(w["sha256"]),
            tensors=tensors,
            tokenizer=TokenizerInfo(
                file=str(tok["file"]), sha256=str(tok["sha256"]),
                bos_token_id=tok.get("bos_token_id"),
                eos_token_ids=tuple(int(i) for i in tok.get("eos_token_ids", [])),
                bos_token=tok.get("bos_token"), eos_token=tok.get("eos_token"),
                chat_template=tok.get("chat_template"),
            ),
            stages=stages,
            source=dict(data.get("source", {})),
            created_by=str(data.get("created_by", "")),
            **_tier(data.get("tier"), source),
        )
    except (KeyError, TypeError, ValueError, IndexError) as err:
        raise ModelError(f"{source}: malformed manifest ({type(err).__name__}: {err})") from None
    check_tensors(source, manifest.tensors, TENSOR_DTYPES, manifest.weights_file,
                  manifest.weights_bytes)
    check_file_names(source, (manifest.weights_file, manifest.tokenizer.file,
                              *(s.file for s in stages)))
    return manifest


def _tier(raw: Any, source: str) -> dict[str, Any]:
    """The manifest's optional ``tier`` object, checked: ``{"tier": "micro"|"small"|"large",
    "quality": number >= 0}``."""
    from meshd.core.tiers import TIERS

    if raw is None:
        return {}
    if not isinstance(raw, dict) or raw.get("tier") not in TIERS:
        raise ModelError(f"{source}: tier must be {{\"tier\": one of {', '.join(TIERS)}, \"quality\": number}}")
    q = raw.get("quality", 0.0)
    if isinstance(q, bool) or not isinstance(q, int | float) or not 0 <= q < 1e6:
        raise ModelError(f"{source}: tier.quality must be a number >= 0")
    return {"tier": str(raw["tier"]), "quality": float(q)}
