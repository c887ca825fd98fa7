"""Building a model folder: where an importer may write, the source's JSON files, its tokenizer,
and the folder built in a temporary sibling then renamed into place, so that a failed import
leaves nothing half-written (``staging``). Every importer (Hugging Face, GGUF, BERT) uses these.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from meshd.errors import LocalError, ModelError
from meshd.modeldir.manifest import MANIFEST


def check_output_dir(out: Path, force: bool) -> None:
    """Whether a model may be imported into ``out``: absent or empty, or (with ``force``) a
    meshd model to replace; a ``LocalError`` otherwise."""
    if not out.exists():
        return
    if not out.is_dir():
        raise LocalError(f"{out}: exists and is not a directory")
    if not any(out.iterdir()):
        out.rmdir()
        return
    if not force:
        raise LocalError(f"{out}: already exists (use --force to replace a meshd model)")
    if not (out / MANIFEST).is_file():
        raise LocalError(f"{out}: refusing to replace a directory that is not a meshd model")


def read_json(path: Path, *, missing_ok: bool = False) -> Any:
    """A source JSON file (None when it is absent and ``missing_ok``), or ``ModelError``."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        if missing_ok:
            return None
        raise ModelError(f"{path.parent}: {path.name} is missing") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ModelError(f"{path.name}: not valid JSON ({err})") from None


def read_json_object(path: Path) -> dict[str, Any]:
    """A source JSON file that must hold an object (``config.json``)."""
    data = read_json(path)
    if not isinstance(data, dict):
        raise ModelError(f"{path.name}: expected a JSON object")
    return data


def load_tokenizer(path: Path, vocab_size: int) -> Any:
    """The source's ``tokenizer.json`` as a ``tokenizers.Tokenizer``, checked to fit the model's
    ``vocab_size`` rows; ``ModelError`` naming the file otherwise."""
    from tokenizers import Tokenizer

    if not path.is_file():
        raise ModelError(f"{path.parent}: {path.name} is missing (only fast tokenizers work)")
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as err:  # the library raises a bare Exception on any parse error
        raise ModelError(f"{path.name}: cannot load ({str(err).splitlines()[0]})") from None
    n = tok.get_vocab_size(with_added_tokens=True)
    if n > vocab_size:
        raise ModelError(f"{path.name}: {n} tokens but config.json has vocab_size={vocab_size}")
    return tok


@contextmanager
def staging(out: Path, force: bool) -> Iterator[Path]:
    """A fresh temporary sibling of ``out`` to build the folder in; renamed to ``out`` when the
    block ends, removed if it raises. With ``force`` an existing ``out`` is replaced. When
    another process has just installed the same folder (first use from two processes), its
    copy stays and this one goes."""
    tmp = out.parent / f".{out.name}.importing-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    try:
        yield tmp
        if force and out.exists():
            shutil.rmtree(out)
        try:
            tmp.rename(out)
        except OSError:
            if not (out / MANIFEST).is_file():
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
