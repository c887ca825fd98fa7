"""`meshd audit`: the node's audit trail (refused handshakes, revocations, config and key use)."""

from __future__ import annotations

import argparse
import time
from typing import Any

import trio

from meshd.cli.common import add_socket_arg, print_json, table
from meshd.control.client import call
from meshd.core.audit import KINDS
from meshd.core.messages import MessageType
from meshd.exitcodes import Exit


def register(sub: Any) -> None:
    p = sub.add_parser(
        "audit", help="list this node's security events",
        description="List the node's audit trail, newest first: refused handshakes "
        "(attestation_failed, with the reason and the peer's address), revocation lists put in "
        "force, peers cut off by one (revoked), and at each start the config file read "
        "(config_loaded, with its sha256) and the node key in use (key_loaded). The trail is "
        "pruned with the rest of the store ([store] in docs/config.md).")
    p.add_argument("-n", type=int, default=50, metavar="N", help="at most N events (default 50)")
    p.add_argument("--kind", choices=KINDS, help="only events of this kind")
    p.add_argument("--json", action="store_true", help="one JSON object: {events: [...]}")
    add_socket_arg(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    fields: dict[str, Any] = {"n": max(0, args.n)}
    if args.kind:
        fields["kind"] = args.kind
    reply = trio.run(call, args.socket, MessageType.AUDIT_REQ, fields)
    events = (reply.get("data") or {}).get("events", [])
    if args.json:
        print_json({"events": events})
        return Exit.OK
    if not events:
        print("no audit events")
        return Exit.OK
    rows = [[_when(e["ts"]), e["kind"], _short(e.get("peer_id") or "-"), e.get("reason") or "",
             _detail(e.get("detail"))] for e in events]
    print(table(rows, ["time", "kind", "peer", "reason", "detail"]))
    return Exit.OK


def _when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def _short(peer_id: str) -> str:
    return peer_id if len(peer_id) <= 16 else f"{peer_id[:8]}..{peer_id[-6:]}"


def _detail(detail: Any) -> str:
    if not isinstance(detail, dict):
        return str(detail or "")
    text = " ".join(f"{k}={v}" for k, v in sorted(detail.items()))
    return text if len(text) <= 100 else text[:97] + "..."
