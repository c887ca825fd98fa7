"""A stand-in for ``meshd.engine.gguf_import.import_gguf`` (``meshd.models.pull.GgufImporter``).

It checks the file's GGUF magic, then writes a model directory holding a manifest with the
fields `meshd model list` reads and a copy of the file as its weights; ``fail`` makes it raise
ModelError after writing half of that, as a real importer might. Enough to drive the pull's
fetching, checking, staging and renaming in unit tests without the engine.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from meshd.errors import LocalError, ModelError


@dataclass
class FakeGgufImporter:
    fail: str = ""  # when set: raise ModelError(fail) midway
    calls: list[dict[str, Any]] = field(default_factory=list)

    def __call__(self, gguf_path: Path, out: Path, *, stages: int = 1, dtype: str = "auto",
                 name: str | None = None, force: bool = False) -> dict[str, Any]:
        self.calls.append({"gguf": gguf_path, "out": out, "stages": stages, "dtype": dtype,
                           "name": name, "force": force})
        with gguf_path.open("rb") as f:
            if f.read(4) != b"GGUF":
                raise ModelError(f"{gguf_path}: not a GGUF file")
        if out.exists() and not force:
            raise LocalError(f"{out} already exists (pass force)")
        out.mkdir(parents=True)
        shutil.copyfile(gguf_path, out / "weights.bin")
        if self.fail:
            raise ModelError(self.fail)
        manifest = {"format": "meshd-model", "format_version": 1, "name": name or out.name,
                    "version": "1", "created_by": "fake", "source": {"gguf": gguf_path.name},
                    "architecture": {"arch": "llama"}, "dtype": "q4_fake",
                    "weights": {"file": "weights.bin", "bytes": gguf_path.stat().st_size,
                                "sha256": "", "tensors": []},
                    "tokenizer": {"file": "tokenizer.json", "sha256": ""}, "stages": []}
        (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
        return manifest
