"""`meshd keys issue NAME`: create a node identity and its certificate."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from meshd.cli.keys import options
from meshd.cli.keys.options import DEFAULT_DAYS, MAX_DAYS
from meshd.exitcodes import Exit


def register(ks: Any) -> None:
    q = ks.add_parser(
        "issue",
        help="create a node identity and its certificate",
        description="Create a node identity in OUT: node.key (a fresh libp2p Ed25519 key, mode "
        "0600), node.cert (the CA's certificate binding its peer ID to NAME, roles, labels and "
        "a validity window, with the next serial), ca.pub, and revoked.crl if the CA has one. "
        "Copy OUT to the node and point its config's [keys] at it.",
    )
    q.add_argument(
        "name", metavar="NAME", type=options.node_name, help="node name, e.g. gw-eu-1"
    )
    options.add_dir(q)
    q.add_argument(
        "--out",
        type=Path,
        default=None,
        help="where to write the node files (default DIR/nodes/NAME)",
    )
    q.add_argument(
        "--role",
        action="append",
        default=[],
        type=options.role,
        help="a role such as gateway or worker (repeat for several)",
    )
    q.add_argument(
        "--label",
        action="append",
        default=[],
        type=options.label,
        metavar="KEY=VALUE",
        help="a label such as region=eu-west or residency=eu (repeat for several)",
    )
    q.add_argument(
        "--days",
        type=options.days,
        default=DEFAULT_DAYS,
        help=f"validity in days from now (default {DEFAULT_DAYS}, at most {MAX_DAYS})",
    )
    q.add_argument("--force", action="store_true", help="replace existing files in OUT")
    q.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from meshd import ca
    from meshd.net import identity as ident

    issued = ca.issue(
        options.ca_dir(args),
        args.name,
        Path(args.out) if args.out is not None else None,
        days=args.days,
        labels=args.label,
        roles=args.role,
        force=args.force,
    )
    cert = issued.certificate
    print(f"issued {cert.name} serial={cert.serial} peer_id={cert.peer_id}")
    print(f"  valid {ca.utc_text(cert.not_before)} to {ca.utc_text(cert.not_after)}")
    if cert.roles:
        print(f"  roles  {', '.join(cert.roles)}")
    if cert.labels:
        print(f"  labels {' '.join(f'{k}={v}' for k, v in cert.labels.items())}")
    files = f"{ident.NODE_KEY_FILE},{ident.NODE_CERT_FILE},{ident.CA_PUBLIC_KEY_FILE}"
    print(f"  files  {issued.out}/{{{files}}}")
    return int(Exit.OK)
