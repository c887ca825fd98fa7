"""`meshd peers`: the peer table as this node sees it."""

from __future__ import annotations

import argparse
from typing import Any

import trio

from meshd.cli.common import add_socket_arg, print_json, table
from meshd.control.client import call
from meshd.core.messages import MessageType
from meshd.exitcodes import Exit


def register(sub: Any) -> None:
    p = sub.add_parser("peers", help="list the peers this node knows",
                       description="List every attested peer in this node's table: name, short "
                       "peer id, region, hardware, models/layers, queue depth, advert age, and "
                       "the RTT (measured by pings, and estimated from Vivaldi coordinates).")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    add_socket_arg(p)
    p.set_defaults(func=run)


def _fmt_ms(v: Any) -> str:
    return "-" if v is None else f"{v:.1f}"


def run(args: argparse.Namespace) -> int:
    reply = trio.run(call, args.socket, MessageType.PEERS_REQ, {})
    peers = reply["peers"]
    if args.json:
        print_json(peers)
        return Exit.OK
    if not peers:
        print("no peers yet")
        return Exit.OK
    rows = []
    for p in peers:
        hw = p.get("hardware") or {}
        gpus = hw.get("gpus") or []
        hwtxt = f"{hw.get('kind', '?')}/{hw.get('cpu_cores', '?')}c" + (f"+{len(gpus)}gpu" if gpus else "")
        models = ",".join(f"{m['name']}[{m['layers'][0]}-{m['layers'][1]}]" for m in p["models"]) or "-"
        rows.append([p["name"], p["peer_id"][-10:], p.get("region") or "-", hwtxt, models,
                     p["queue_depth"], f"{p['advert_age_s']:.1f}s", _fmt_ms(p.get("rtt_measured_ms")),
                     _fmt_ms(p.get("rtt_estimated_ms"))])
    print(table(rows, ["NAME", "PEER", "REGION", "HARDWARE", "MODELS", "QUEUE", "AGE",
                       "RTT(ms)", "EST(ms)"]))
    return Exit.OK
