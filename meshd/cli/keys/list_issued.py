"""`meshd keys list`: the certificates this CA issued, each with its state."""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from typing import Any

from meshd.cli.keys import options
from meshd.exitcodes import Exit


def register(ks: Any) -> None:
    q = ks.add_parser(
        "list",
        help="list the certificates this CA issued",
        description="List DIR/issued.tsv with each certificate's state (valid, expired, revoked).",
    )
    options.add_dir(q)
    q.add_argument("--json", action="store_true", help="print one JSON array")
    q.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from meshd import ca

    ca_dir = options.ca_dir(args)
    revoked = ca.revoked_serials(ca_dir)
    now = time.time()
    rows = [(entry, entry.state(revoked, now)) for entry in ca.issued(ca_dir)]
    if args.json:
        print(json.dumps([{**dataclasses.asdict(e), "state": state} for e, state in rows]))
        return int(Exit.OK)
    print(f"{'SERIAL':>6}  {'NAME':<20} {'STATE':<8} {'NOT AFTER':<23} PEER ID")
    for e, state in rows:
        print(
            f"{e.serial:>6}  {e.name:<20} {state:<8} {ca.utc_text(e.not_after):<23} {e.peer_id}"
        )
    return int(Exit.OK)
