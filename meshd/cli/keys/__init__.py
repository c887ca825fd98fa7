"""`meshd keys`: the mesh CA, node identities, revocation, and a look inside key files.

One module per action, each thin over ``meshd.ca``: it adds its parser to ``ks`` and runs by
parsing, calling the library and printing. ``meshd.ca`` (and with it libp2p, about a second to
import) is imported only when an action runs, so ``meshd --help`` stays quick.
"""

from __future__ import annotations

import argparse
from typing import Any

from meshd.cli import api_keys
from meshd.cli.keys import init_ca, issue, list_issued, push_revocations, revoke, show
from meshd.exitcodes import Exit

DESCRIPTION = """\
Keys of a meshd mesh. One Ed25519 CA per mesh signs a certificate for each node, binding the
node's libp2p peer ID to its name, roles and labels for a validity window. On every connection
both sides prove their certificate inside the Noise channel; a peer without a valid one is cut
off before it reaches any meshd protocol. See keys/README.md.

  meshd keys init-ca                      create the CA (once per mesh)
  meshd keys issue gw-eu-1 --role gateway --label region=eu-west
  meshd keys revoke 7                     add serial 7 to the signed revocation list
  meshd keys push-revocations             hand that list to a running node; gossip spreads it
  meshd keys show FILE                    what a key, certificate or revocation list holds
  meshd keys api-key create alice --config meshd.toml   a key of the HTTP API (shown once)
"""


def register(sub: Any) -> None:
    p = sub.add_parser(
        "keys",
        help="create the mesh CA, issue and revoke node certificates",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.set_defaults(func=_help(p))
    ks = p.add_subparsers(dest="keys_command", metavar="ACTION")
    for action in (init_ca, issue, revoke, push_revocations, list_issued, show):
        action.register(ks)
    api_keys.register(ks)  # `meshd keys api-key ...`: keys of the HTTP API


def _help(parser: argparse.ArgumentParser) -> Any:
    def show_help(args: argparse.Namespace) -> int:
        parser.print_help()
        return int(Exit.USAGE)

    return show_help
