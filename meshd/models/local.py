"""The models folder (``meshd.paths.models_home``): what is in it, and which model a name means.

Every directory of the folder holding a ``manifest.json`` is a model: a generation model
(docs/model-format.md) or an embedding model (docs/embeddings.md). A model pulled from the
catalog also holds ``pulled.json`` (what was fetched, with its hashes). Names starting with a
dot are a pull or import in progress and are not listed.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from meshd.errors import LocalError, ModelError
from meshd.modeldir.manifest import MANIFEST
from meshd.models import catalog

PULL_RECORD = "pulled.json"
DEFAULT = "default"  # the model shipped with meshd (or $MESHD_DEFAULT_MODEL)


@dataclass(frozen=True, slots=True)
class LocalModel:
    name: str  # the manifest's name (the directory's when the manifest cannot be read)
    path: Path
    kind: str  # "generation", "embedding", or "" when unreadable
    arch: str  # e.g. "llama", "bert"
    format: str  # the stored weights: the manifest's dtype (fp32, fp16, a 4-bit format...)
    size_bytes: int  # every file of the directory
    tier: str  # docs/tiers.md; "" = none
    catalog: str  # the catalog name it was pulled as; "" = imported by hand
    problem: str = ""  # why the directory is not a usable model ("" = fine)
    chat: bool = False  # its tokenizer has a chat template (`meshd submit --chat`)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "path": str(self.path)}


def dir_size(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


def describe(directory: Path) -> LocalModel:
    """What ``directory`` holds, read from its manifest without loading anything; a directory
    whose manifest cannot be read is described with its ``problem``."""
    size = dir_size(directory)
    pulled = _json(directory / PULL_RECORD)
    from_catalog = str(pulled.get("catalog", "")) if isinstance(pulled, dict) else ""
    try:
        data = json.loads((directory / MANIFEST).read_text())
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as e:
        return LocalModel(directory.name, directory, "", "", "", size, "", from_catalog,
                          f"{MANIFEST}: {e}")
    fmt = data.get("format")
    tier = data.get("tier")
    tier_name = str(tier.get("tier", "")) if isinstance(tier, dict) else ""
    arch = data.get("architecture")
    if fmt == "meshd-embedding":
        arch_name = "bert"
        kind = "embedding"
    elif fmt == "meshd-model":
        arch_name = str(arch.get("arch", "")) if isinstance(arch, dict) else ""
        kind = "generation"
    else:
        return LocalModel(str(data.get("name", directory.name)), directory, "", "", "", size,
                          "", from_catalog, f"{MANIFEST}: not a meshd model (format {fmt!r})")
    tok = data.get("tokenizer")
    chat = isinstance(tok, dict) and bool(tok.get("chat_template"))
    return LocalModel(str(data.get("name", directory.name)), directory, kind, arch_name,
                      str(data.get("dtype", "")), size, tier_name, from_catalog, chat=chat)


def list_models(models_dir: Path) -> list[LocalModel]:
    """The models of the folder, by name (none when it does not exist)."""
    if not models_dir.is_dir():
        return []
    dirs = [d for d in models_dir.iterdir()
            if d.is_dir() and not d.name.startswith(".") and (d / MANIFEST).exists()]
    return sorted((describe(d) for d in dirs), key=lambda m: (m.name, str(m.path)))


@dataclass(frozen=True, slots=True)
class ModelChoice:
    """What a ``--model`` argument means: a model directory (or ``default``) to serve as it is,
    or a catalog entry to pull into ``path`` first."""

    path: str  # a model directory, or "default"
    pull: catalog.CatalogEntry | None = None


def choose_model(text: str, models_dir: Path) -> ModelChoice:
    """``default``; a model directory; a model of the models folder; a catalog name (pulled
    into the folder when missing); else LocalError saying all four."""
    if text == DEFAULT:
        return ModelChoice(DEFAULT)
    given = Path(text).expanduser()
    if given.is_dir():
        if not (given / MANIFEST).exists():
            raise ModelError(f"{given}: not a meshd model directory (no {MANIFEST})")
        return ModelChoice(str(given.resolve()))
    in_folder = models_dir / text
    if "/" not in text and (in_folder / MANIFEST).exists():
        return ModelChoice(str(in_folder.resolve()))
    entry = catalog.find(text)
    if entry is not None:
        return ModelChoice(str((models_dir / entry.name).resolve()), pull=entry)
    raise LocalError(f"model {text!r}: no such model directory, no model of that name in "
                     f"{models_dir}, and not in meshd's catalog ({', '.join(catalog.names())}); "
                     f"`default` is the model shipped with meshd")


def lookup(name: str) -> catalog.CatalogEntry:
    """The catalog entry ``name``; LocalError listing the catalog when there is none."""
    entry = catalog.find(name)
    if entry is None:
        raise LocalError(f"no model {name!r} in meshd's catalog; it has: "
                         f"{', '.join(catalog.names())} (`meshd model catalog` describes them)")
    return entry


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None
