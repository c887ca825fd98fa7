"""`meshd keys revoke SERIAL...`: add serials to the CA-signed revocation list."""

from __future__ import annotations

import argparse
from typing import Any

from meshd.cli.keys import options
from meshd.exitcodes import Exit


def register(ks: Any) -> None:
    q = ks.add_parser(
        "revoke",
        help="add serials to the CA-signed revocation list",
        description="Add SERIALs to DIR/revoked.crl and sign it with a version one higher. A "
        "running mesh spreads the newer list by gossip and every node closes its connections "
        "to the revoked peers; a node started later reads it from its [keys] revocations file.",
    )
    q.add_argument(
        "serials", metavar="SERIAL", nargs="+", type=options.serial, help="serial to revoke"
    )
    options.add_dir(q)
    q.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from meshd import ca

    done = ca.revoke(options.ca_dir(args), args.serials)
    rl, path = done.revocation_list, done.path
    for serial in done.serials:
        print(f"revoked serial={serial} ({done.names.get(serial, 'never issued by this CA')})")
    print(f"revocation list version {rl.version}: {len(rl.serials)} serial(s) -> {path}")
    print(f"next: hand it to any running node with `meshd keys push-revocations {path} "
          "[--socket PATH]`;")
    print("the mesh spreads it by gossip; nodes started later load it from [keys] revocations")
    return int(Exit.OK)
