"""`meshd status`: this node's identity, uptime, queue and the statistics of each service."""

from __future__ import annotations

import argparse
from typing import Any

import trio

from meshd.cli.common import add_socket_arg, print_json
from meshd.control.client import call
from meshd.core.messages import MessageType
from meshd.exitcodes import Exit


def register(sub: Any) -> None:
    p = sub.add_parser("status", help="show this node's status",
                       description="Show the local node: identity, uptime, queue, models and the "
                       "statistics of each service (gossip, attestation, links, requests).")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    add_socket_arg(p)
    p.set_defaults(func=run)


def _live(hw: dict[str, Any]) -> str:
    """The live figures of the latest reading, as ``, load 0.52, 11.8 GiB free, 72 W``."""
    parts = []
    if isinstance(hw.get("cpu_load_1m"), int | float):
        parts.append(f"load {hw['cpu_load_1m']:.2f}")
    if isinstance(hw.get("memory_available_bytes"), int) and hw["memory_available_bytes"]:
        parts.append(f"{hw['memory_available_bytes'] / (1 << 30):.1f} GiB free")
    for g in hw.get("gpus") or []:
        if isinstance(g, dict) and not g.get("shared_memory"):
            parts.append(f"gpu{g.get('index')} {g.get('memory_free_bytes', 0) / (1 << 30):.1f} GiB free")
    watts = sum(g.get("power_draw_w") or 0 for g in hw.get("gpus") or [] if isinstance(g, dict))
    watts += hw.get("power_w") or 0
    if watts:
        parts.append(f"{watts:.0f} W")
    throttle = [*(hw.get("throttle") or []),
                *(r for g in hw.get("gpus") or [] if isinstance(g, dict) for r in g.get("throttle") or [])]
    if throttle:
        parts.append("throttled: " + ",".join(map(str, throttle)))
    if hw.get("stale"):
        parts.append("failing: " + ",".join(map(str, hw["stale"])))
    return "".join(f", {p}" for p in parts)


def run(args: argparse.Namespace) -> int:
    reply = trio.run(call, args.socket, MessageType.STATUS_REQ, {})
    data = reply["data"]
    if args.json:
        print_json(data)
        return Exit.OK
    print(f"node      {data['name']}  ({data['peer_id']})")
    print(f"region    {data.get('region') or '-'}   labels {data.get('labels')}")
    print(f"uptime    {data['uptime_s']:.0f} s   peers {data['peers']}   strategy {data['strategy']}")
    print(f"queue     {data['queue_depth']} waiting, {data['in_flight']} running")
    hw = data.get("hardware") or {}
    print(f"hardware  {hw.get('kind', '?')}, {hw.get('cpu_cores', '?')} cores{_live(hw)}")
    for m in data["models"]:
        print(f"model     {m['model']} layers {m['layers'][0]}-{m['layers'][1]} of {m['num_layers']}: "
              f"served {m['served']}, failed {m['failed']}, busy {m['busy_refusals']}, "
              f"prefill {m['prefill_tps']} tok/s, decode {m['decode_tps']} tok/s")
        if (px := m.get("prefix_cache")) is not None:
            print(f"  prefix cache {px['bytes'] / 2**20:.1f} of {px['budget_bytes'] / 2**20:.0f} "
                  f"MiB, {px['blocks']} blocks of {px['block_tokens']} tokens: "
                  f"{px['hits']} of {px['lookups']} lookups hit, {px['reused_tokens']} tokens "
                  f"reused, {px['evicted_blocks']} blocks evicted")
            if "answers_kept" in (b := m.get("batch") or {}):  # [engine] keep_answers
                print(f"  answers kept {b['answers_kept']} ({b['answer_tokens_prefilled']} tokens "
                      f"prefilled again), {b['answers_waiting']} waiting, "
                      f"{b['answers_dropped']} dropped")
    for name, stats in data["services"].items():
        flat = ", ".join(f"{k}={v}" for k, v in stats.items() if not isinstance(v, dict))
        print(f"{name:<16}{flat}")
    return Exit.OK
