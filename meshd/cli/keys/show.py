"""`meshd keys show FILE`: what a certificate, revocation list or key file holds."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from meshd.exitcodes import Exit


def register(ks: Any) -> None:
    q = ks.add_parser(
        "show",
        help="print what a certificate, revocation list or key file holds",
        description="Print a certificate (node.cert), revocation list (revoked.crl), public key "
        "(ca.pub) or private key file (its public half and peer ID only, never the secret). "
        "Signatures are checked when a ca.pub is beside FILE or given with --ca.",
    )
    q.add_argument("file", metavar="FILE", type=Path)
    q.add_argument("--ca", type=Path, default=None, help="CA public key to check signatures with")
    q.add_argument("--json", action="store_true", help="print one JSON object")
    q.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from meshd import ca

    path = Path(args.file)
    info = ca.describe(path, Path(args.ca) if args.ca is not None else None)
    if args.json:
        print(json.dumps(info))
        return int(Exit.OK)
    print(f"{info.pop('kind')}  {path}")
    for key, value in info.items():
        if isinstance(value, list):
            value = ", ".join(str(v) for v in value) or "-"
        elif isinstance(value, dict):
            value = " ".join(f"{k}={v}" for k, v in value.items()) or "-"
        print(f"  {key:<13} {value}")
    return int(Exit.OK)
