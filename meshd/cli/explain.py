"""`meshd explain REQUEST_ID`: why a request went where it did."""

from __future__ import annotations

import argparse
from typing import Any

import trio

from meshd.cli.common import add_socket_arg, print_json
from meshd.control.client import call
from meshd.core.messages import MessageType
from meshd.errors import LocalError
from meshd.exitcodes import Exit


def register(sub: Any) -> None:
    p = sub.add_parser("explain", help="explain the route of a request",
                       description="Explain why a request went where it did: the candidates with "
                       "their predicted time to first token and its parts, the constraints that "
                       "excluded nodes, the choice, hedges, retries and the outcome. Ask the node "
                       "the request was submitted to.")
    p.add_argument("request_id")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    add_socket_arg(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    reply = trio.run(call, args.socket, MessageType.EXPLAIN_REQ, {"rid": args.request_id})
    record = reply["record"]
    if record is None:
        raise LocalError(f"no request {args.request_id} in this node's journal "
                         "(ask the node it was submitted to)")
    if args.json:
        print_json(record)
    else:
        from meshd.store.explain import explain_text

        print(explain_text(record))
    return Exit.OK
