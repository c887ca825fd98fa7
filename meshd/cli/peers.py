"""`meshd peers`: not built yet (placeholder so the command list is stable)."""

from __future__ import annotations

import argparse
from typing import Any


def register(sub: Any) -> None:
    p = sub.add_parser("peers", help="(not built yet)", description="Not built yet.")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    print("meshd peers: not built yet")
    return 1
