"""The weights file of a generative model, checked at load: the tensors a stage reads
(``meshd.modeldir.weights`` writes the file)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path

from meshd.engine.manifest import Manifest
from meshd.errors import ModelError


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

