"""Shared bits of the client subcommands."""

from __future__ import annotations

import json
import sys
from typing import Any


def add_socket_arg(p: Any) -> None:
    p.add_argument(
        "--socket",
        metavar="PATH",
        help="control socket of the daemon to talk to (default: $MESHD_SOCKET, the system "
        "daemon's /run/meshd/meshd.sock, else the first node of the last `meshd testnet up`)",
    )


def print_json(obj: Any) -> None:
    json.dump(obj, sys.stdout, indent=2, sort_keys=True, default=str)
    sys.stdout.write("\n")


def table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=False)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    out = [fmt.format(*header)]
    out.extend(fmt.format(*[str(x) for x in r]) for r in rows)
    return "\n".join(out)
