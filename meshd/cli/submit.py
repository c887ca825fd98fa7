"""`meshd submit`: send a prompt through the local daemon and stream the answer."""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from contextlib import aclosing
from typing import Any

import trio

from meshd.cli.common import add_socket_arg, print_json
from meshd.control.client import submit_events
from meshd.core.messages import MessageType
from meshd.errors import PeerGoneError
from meshd.exitcodes import Exit

HELP = """\
Submit a prompt through the local daemon. It is served on this node, forwarded to the peer with
the best predicted time to first token, or run as a pipeline of layer-range stages. Tokens stream
as they arrive; at the end meshd prints the request id, the node that served it, the time to
first token and tokens/s. `meshd explain REQUEST_ID` then tells why that route was chosen.

The prompt is read from stdin when PROMPT is omitted or is "-".
"""


def register(sub: Any) -> None:
    p = sub.add_parser("submit", help="submit a prompt to the mesh", description=HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("prompt", nargs="?", default="-", help="the prompt (default: read stdin)")
    p.add_argument("--model", "-m", help="model name, or auto: the entry node picks the cheapest "
                   "model tier the prompt needs (docs/tiers.md); default: the node's default "
                   "model ([tiers] default_auto makes it auto)")
    p.add_argument("--allow-lower-tier", action="store_true", default=None,
                   help="with --model auto: a lower tier than the prompt needs may serve it when "
                   "no node of that tier or above can")
    p.add_argument("--max-tokens", "-n", type=int,
                   help="tokens to generate at most (default 64, or what the model's context leaves)")
    p.add_argument("--temperature", "-t", type=float, default=0.0, help="0 is greedy (default)")
    p.add_argument("--top-k", type=int)
    p.add_argument("--top-p", type=float)
    p.add_argument("--repetition-penalty", type=float)
    p.add_argument("--seed", type=int)
    p.add_argument("--no-cache", dest="cache", action="store_false", default=None,
                   help="never answer from (or store in) the node's semantic cache")
    p.add_argument("--cache", dest="cache", action="store_true",
                   help="take part in the semantic cache even when sampling (temperature > 0)")
    p.add_argument("--cache-max-error", type=float, metavar="E",
                   help="the cache's bound on near misses served from its semantic path, in "
                   "[0, 1) (0: exact repeats only; default: the node's [cache] max_error)")
    p.add_argument("--rag", metavar="COLLECTION",
                   help="put the chunks of this retrieval collection nearest the prompt into it, "
                   "with their sources (`meshd rag add`; docs/rag.md); --json lists them under "
                   "sources")
    p.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    p.add_argument("--residency", help="only nodes whose certificate labels carry this tag may serve")
    p.add_argument("--strategy", help="routing strategy for this request (default: the node's)")
    p.add_argument("--client", help="the client this request counts against in [routing] quotas "
                   "(default: local)")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    p.add_argument("--pipeline", choices=["auto", "never", "always"],
                   help="run as a pipeline of layer-range stages: auto (the planner decides, "
                   "default), never, or always (even when one node serves the whole model)")
    p.add_argument("--json", action="store_true", help="print one JSON object at the end, no stream")
    add_socket_arg(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    prompt = args.prompt
    if prompt == "-":
        prompt = sys.stdin.read()
    if not prompt.strip():
        print("meshd submit: the prompt is empty", file=sys.stderr)
        return Exit.USAGE
    fields: dict[str, Any] = {"rid": uuid.uuid4().hex[:16], "prompt": prompt, "chat": args.chat,
                              "temperature": args.temperature}
    for k in ("cache", "max_tokens", "model", "top_k", "top_p", "repetition_penalty", "seed", "residency", "strategy",
              "pipeline", "client", "rag", "allow_lower_tier", "cache_max_error"):
        v = getattr(args, k)
        if v is not None:
            fields[k] = v
    if args.stop:
        fields["stop"] = list(args.stop)
    result = trio.run(_submit, args.socket, fields, not args.json)
    if args.json:
        print_json(result)
    else:
        print()
        ttft = result.get("ttft_ms")
        tps = result.get("tokens_per_s")
        print(
            f"-- request {result['request_id']} served by {result['served_by']}"
            + (f" from its cache ({(result.get('cache') or {}).get('kind')})"
               if result.get("cached") else "") + " "
            f"(route: {' -> '.join(result['route'])}); "
            f"time to first token {ttft:.1f} ms; "
            + (f"{tps:.1f} tokens/s" if tps else f"{result['tokens']} tokens"),
            file=sys.stderr if not sys.stdout.isatty() else sys.stdout,
        )
        for src in result.get("sources") or ():
            print(f"-- source: {src['source']} (score {src['score']:.3f})", file=sys.stderr)
        for note in result.get("notes") or ():
            print(f"-- note: {note}", file=sys.stderr)
    return Exit.OK


async def _submit(socket: str | None, fields: dict[str, Any], stream: bool) -> dict[str, Any]:
    t0 = time.perf_counter()
    first: float | None = None
    route: dict[str, Any] = {}
    async with aclosing(submit_events(socket, fields)) as events:
        async for msg in events:
            t = msg["t"]
            if t == MessageType.ROUTE:
                route = msg
            elif t == MessageType.TOKENS:
                if first is None:
                    first = time.perf_counter()
                if stream:
                    sys.stdout.write(msg.get("text", ""))
                    sys.stdout.flush()
            elif t == MessageType.DONE:
                stats = dict(msg.get("stats") or {})
                stats.setdefault("served_by", route.get("served_by"))
                stats.setdefault("route", route.get("route", []))
                stats["client_ttft_ms"] = round((first - t0) * 1000, 3) if first else None
                return stats
    raise PeerGoneError("the daemon ended the request without a DONE frame")
