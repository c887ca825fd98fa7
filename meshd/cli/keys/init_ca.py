"""`meshd keys init-ca`: create the mesh CA key pair."""

from __future__ import annotations

import argparse
from typing import Any

from meshd.cli.keys import options
from meshd.exitcodes import Exit


def register(ks: Any) -> None:
    q = ks.add_parser(
        "init-ca",
        help="create the mesh CA key pair",
        description="Create the mesh CA: DIR/ca.key (Ed25519, mode 0600; keep it offline if you "
        "can) and DIR/ca.pub (give it to every node). Refuses to replace an existing CA.",
    )
    options.add_dir(q)
    q.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from meshd import ca

    new = ca.init_ca(options.ca_dir(args))
    print(f"created CA {new.key_id} in {new.directory}")
    print(f"  {new.key_path}  (private, 0600: keep it safe, ideally offline)")
    print(f"  {new.public_key_path}  (public: every node needs it)")
    print(f"next: meshd keys issue NAME --dir {new.directory}")
    return int(Exit.OK)
