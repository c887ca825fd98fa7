"""Small stand-ins for a catalog entry's wheels: zip files holding a GGUF file in parts."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

from meshd.models.catalog import CatalogEntry, Member, Wheel

GGUF = b"GGUF" + bytes(range(256)) * 40  # a GGUF magic and some bytes


def make_wheels(directory: Path, *, name: str = "toy-model") -> CatalogEntry:
    """Two wheels in ``directory``, each with half of a GGUF file, and a license in the first;
    returns the catalog entry that pins them."""
    directory.mkdir(parents=True, exist_ok=True)
    halves = (GGUF[: len(GGUF) // 2], GGUF[len(GGUF) // 2:])
    wheels, parts = [], []
    for i, half in enumerate(halves):
        fn = f"toy_part{i}-1.0-py3-none-any.whl"
        member = f"toy_part{i}/data/toy.gguf.part{i:02d}"
        with zipfile.ZipFile(directory / fn, "w") as z:
            z.writestr(member, half)
            if i == 0:
                z.writestr("toy_part0/LICENSE.txt", "toy license\n")
        data = (directory / fn).read_bytes()
        wheels.append(Wheel(f"toy-part{i}", "1.0", fn, hashlib.sha256(data).hexdigest(), len(data)))
        parts.append(Member(fn, member))
    return CatalogEntry(
        name=name, summary="a toy", source="here", license="Toy-1.0", license_url="https://x",
        accept=True, wheels=tuple(wheels), parts=tuple(parts), gguf_name="toy.gguf",
        gguf_sha256=hashlib.sha256(GGUF).hexdigest(), gguf_size=len(GGUF),
        keep=((Member(wheels[0].filename, "toy_part0/LICENSE.txt"), "LICENSE"),), tier="micro",
        quality=0.25)
