"""`meshd cache stats|clear`: the entry node's semantic cache (docs/cache.md)."""

from __future__ import annotations

import argparse
from typing import Any

import trio

from meshd.cli.common import add_socket_arg, print_json
from meshd.control.client import call
from meshd.core.messages import MessageType
from meshd.exitcodes import Exit


def register(sub: Any) -> None:
    p = sub.add_parser(
        "cache", help="the semantic cache: statistics, or clear it",
        description="The node's semantic cache answers a prompt that means what an answered one "
        "meant (same model, settings and client) without running a model. `stats` shows its "
        "state, entries, bytes, hits, misses, verifications and evictions; `clear` drops every "
        "entry. Configure it in [cache] (docs/config.md); it needs the meshd[edge] extra.")
    p.add_argument("op", choices=("stats", "clear"))
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_socket_arg(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    reply = trio.run(call, args.socket, MessageType.CACHE_REQ, {"op": args.op})
    data = reply.get("data") or {}
    if args.json:
        print_json(data)
        return Exit.OK
    if args.op == "clear":
        print(f"cleared {data.get('cleared', 0)} entries")
    for k in sorted(data):
        if k != "cleared" and not isinstance(data[k], dict | list):
            print(f"{k:<16} {data[k]}")
    return Exit.OK
