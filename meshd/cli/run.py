"""`meshd run`: start a node from a TOML config file."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

import trio

from meshd.exitcodes import Exit

HELP = """\
Start this node's daemon: join the mesh through the bootstrap peers in the config, serve the
configured models, gossip signed adverts and answer `meshd submit` on the control socket.
Stops gracefully on SIGTERM or Ctrl-C. See docs/config.md for every key; the keys named in
[keys] must come from `meshd keys issue` (the private key must be mode 0600).

Exit codes: 0 stopped cleanly, 77 key/certificate problem, 78 bad config, 69 network/service
unavailable, 70 internal error.
"""


def register(sub: Any) -> None:
    p = sub.add_parser("run", help="run a node daemon", description=HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", "-c", help="TOML config file (see docs/config.md)")
    p.add_argument("--print-default-config", action="store_true",
                   help="print every config key with its default and exit")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from meshd.config import Config, load_config

    if args.print_default_config:
        print(default_config_text(Config()))
        return Exit.OK
    if not args.config:
        print("meshd run: --config FILE is required (try `meshd run --print-default-config`)")
        return Exit.USAGE
    cfg = load_config(args.config)
    from meshd.node.daemon import build_node, run_daemon

    node = build_node(cfg, args.config)
    trio.run(run_daemon, node)
    return Exit.OK


def default_config_text(cfg: Any) -> str:
    lines = []
    for f in dataclasses.fields(cfg):
        if f.name == "base_dir":
            continue
        value = getattr(cfg, f.name)
        if f.name == "models":
            for m in value:
                lines.append("[[models]]")
                lines.extend(_kv(m))
                lines.append("")
            continue
        lines.append(f"[{f.name}]")
        lines.extend(_kv(value))
        lines.append("")
    return "\n".join(lines)


def _kv(obj: Any) -> list[str]:
    import json

    out = []
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        if isinstance(v, tuple):
            v = list(v)
        if isinstance(v, dict):
            out.append(f"{f.name} = {{}}" if not v else f"{f.name} = {json.dumps(v)}")
        else:
            out.append(f"{f.name} = {json.dumps(v)}")
    return out
