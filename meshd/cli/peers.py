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
                       "peer id, region, hardware, models/layers (with each model's measured "
                       "time to first token and decode tokens/s there), queue depth, advert age, "
                       "the RTT (measured by pings, and estimated from Vivaldi coordinates), and "
                       "the live hardware signals routing reads: free memory for KV cache, "
                       "measured power and throttling (docs/telemetry.md). --json gives each "
                       "peer's whole hardware reading under 'hardware' and those signals under "
                       "'signals'. With cells on ([gossip] cells), also each peer's cell and how "
                       "this node knows it: advert (a member of its cell), probe (a node of another "
                       "cell that answered a probe) or summary (only named by a cell's summary; "
                       "--json has the fields 'cell' and 'known_by').")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    add_socket_arg(p)
    p.set_defaults(func=run)


def _fmt_ms(v: Any) -> str:
    return "-" if v is None else f"{v:.1f}"


def _fmt_gib(v: Any) -> str:
    return "-" if v is None else f"{v / (1 << 30):.1f}G"


def _fmt_w(v: Any) -> str:
    return "-" if v is None else f"{v:.0f}W"


def _fmt_throttle(sig: dict[str, Any]) -> str:
    reasons = sig.get("throttle") or []
    if not reasons:
        return "-"
    return f"{','.join(reasons)} x{sig.get('speed_factor', 1.0):.2f}"


def _speed(m: dict[str, Any]) -> str:
    """A model's measured time to first token and decode rate there ("" before any request)."""
    ttft, tps = m.get("ttft_ms") or 0, m.get("decode_tps") or 0
    if not ttft and not tps:
        return ""
    return f" {ttft:.0f}ms {tps:.0f}t/s"


def run(args: argparse.Namespace) -> int:
    reply = trio.run(call, args.socket, MessageType.PEERS_REQ, {})
    peers = reply["peers"]
    if args.json:
        print_json(peers)
        return Exit.OK
    if not peers:
        print("no peers yet")
        return Exit.OK
    cells = any(p.get("cell") for p in peers)
    rows = []
    for p in peers:
        hw = p.get("hardware") or {}
        gpus = hw.get("gpus") or []
        hwtxt = f"{hw.get('kind', '?')}/{hw.get('cpu_cores', '?')}c" + (f"+{len(gpus)}gpu" if gpus else "")
        if p.get("known_by") == "summary":  # a summary names the models, not the layers
            models = ",".join(m["name"] for m in p["models"]) or "-"
        else:
            models = ",".join(f"{m['name']}[{m['layers'][0]}-{m['layers'][1]}"
                              f"{' ' + m['fmt'] if m.get('fmt') else ''}{_speed(m)}]"
                              for m in p["models"]) or "-"
        sig = p.get("signals") or {}
        row = [p["name"], p["peer_id"][-10:], p.get("region") or "-", hwtxt, models,
               "-" if p.get("queue_depth") is None else p["queue_depth"], f"{p['advert_age_s']:.1f}s",
               _fmt_ms(p.get("rtt_measured_ms")), _fmt_ms(p.get("rtt_estimated_ms")),
               _fmt_gib(sig.get("free_memory_bytes")), _fmt_w(sig.get("power_w")), _fmt_throttle(sig)]
        if cells:
            row += [p.get("cell") or "-", p.get("known_by") or "-"]
        rows.append(row)
    header = ["NAME", "PEER", "REGION", "HARDWARE", "MODELS", "QUEUE", "AGE", "RTT(ms)", "EST(ms)",
              "FREE", "POWER", "THROTTLE"]
    print(table(rows, header + (["CELL", "KNOWN BY"] if cells else [])))
    return Exit.OK
