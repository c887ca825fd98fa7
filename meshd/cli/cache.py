"""`meshd cache stats|clear|feedback`: the entry node's answer cache (docs/cache.md)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import trio

from meshd.cli.common import add_socket_arg, print_json
from meshd.control.client import call
from meshd.core.messages import MessageType
from meshd.exitcodes import Exit


def register(sub: Any) -> None:
    p = sub.add_parser(
        "cache", help="the answer cache: statistics, feedback on an answer, or clear it",
        description="The node's cache answers a repeated request, and a question that means "
        "what an answered one meant within an error bound (same model, settings, context and "
        "client), without running a model. `stats` shows its state, entries, exact and "
        "semantic hits, misses, candidates refused by the bound and feedback; `feedback ID "
        "--wrong` removes the entry that answered request ID (a semantic hit also counts "
        "against the threshold that served it), `--right` counts it; `clear` drops every "
        "entry. Configure it in [cache] (docs/config.md); the semantic path needs the "
        "meshd[edge] extra.")
    p.add_argument("op", choices=("stats", "clear", "feedback"))
    p.add_argument("rid", nargs="?", metavar="ID",
                   help="feedback: the request id (x-request-id; `meshd submit` prints it)")
    verdict = p.add_mutually_exclusive_group()
    verdict.add_argument("--wrong", dest="verdict", action="store_const", const="wrong")
    verdict.add_argument("--right", dest="verdict", action="store_const", const="right")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_socket_arg(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    fields: dict[str, Any] = {"op": args.op}
    if args.op == "feedback":
        if not args.rid or not args.verdict:
            print("meshd cache feedback: give the request id and --wrong or --right",
                  file=sys.stderr)
            return Exit.USAGE
        fields.update(rid=args.rid, verdict=args.verdict)
    reply = trio.run(call, args.socket, MessageType.CACHE_REQ, fields)
    data = reply.get("data") or {}
    if args.json:
        print_json(data)
        return Exit.OK
    if args.op == "clear":
        print(f"cleared {data.get('cleared', 0)} entries")
    for k in sorted(data):
        if k != "cleared" and not isinstance(data[k], dict | list):
            print(f"{k:<20} {data[k]}")
    return Exit.OK
