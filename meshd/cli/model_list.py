"""`meshd model list`: the models in the models folder (docs/models.md)."""

from __future__ import annotations

import argparse
from typing import Any

from meshd.cli.common import print_json, table
from meshd.cli.model_pull import add_models_dir_arg
from meshd.exitcodes import Exit
from meshd.paths import models_home


def register(msub: Any) -> None:
    p = msub.add_parser("list", help="the models in the models folder",
                        description="The models in the models folder (pulled with `meshd model "
                        "pull`, or imported there with `meshd model import --out`): name, "
                        "architecture, format of the weights, size on disk, tier, and the "
                        "catalog name of a pulled one.")
    add_models_dir_arg(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_list)


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


def cmd_list(args: argparse.Namespace) -> int:
    from meshd.models.local import list_models

    folder = args.models_dir or models_home()
    models = list_models(folder)
    if args.json:
        print_json({"models_dir": str(folder), "models": [m.to_json() for m in models]})
        return Exit.OK
    if not models:
        print(f"no models in {folder} (meshd model pull NAME installs one; meshd model catalog "
              "lists them; `default`, the model shipped with meshd, is always there)")
        return Exit.OK
    rows = [[m.name, m.arch or "?", m.format or "?", _size(m.size_bytes), m.tier or "-",
             m.catalog or "-"] + ([f"unusable: {m.problem}"] if m.problem else [""])
            for m in models]
    print(f"models in {folder}:")
    text = table(rows, ["NAME", "ARCH", "FORMAT", "SIZE", "TIER", "CATALOG", ""])
    print("\n".join(line.rstrip() for line in text.splitlines()))
    return Exit.OK
