"""What the `meshd keys` actions share: the --dir option and the argument types, which check a
value with the certificate's own rules so a bad one is a usage error (exit 2) naming it."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from meshd.core.cert import MAX_SERIAL, Certificate
from meshd.paths import state_home

DEFAULT_DAYS = 365
MAX_DAYS = 3650
DIR_HELP = "the CA directory (default: $MESHD_HOME/ca, else ~/.local/state/meshd/ca)"


def add_dir(parser: Any) -> None:
    parser.add_argument("--dir", type=Path, default=None, help=DIR_HELP)


def ca_dir(args: argparse.Namespace) -> Path:
    return Path(args.dir) if args.dir is not None else state_home() / "ca"


def _checked(value: str, **fields: Any) -> str:
    try:
        Certificate(
            serial=1,
            name=fields.get("name", "n"),
            peer_id="1",
            public_key=bytes(32),
            not_before=0,
            not_after=1,
            ca_key_id="0" * 16,
            roles=fields.get("roles", ()),
            labels=fields.get("labels", {}),
        )
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return value


def node_name(value: str) -> str:
    return _checked(value, name=value)


def role(value: str) -> str:
    return _checked(value, roles=(value,))


def label(value: str) -> tuple[str, str]:
    key, sep, val = value.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"label {value!r} is not KEY=VALUE")
    _checked(value, labels={key: val})
    return key, val


def days(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number of days") from None
    if not 1 <= n <= MAX_DAYS:
        raise argparse.ArgumentTypeError(f"days must be 1..{MAX_DAYS}")
    return n


def serial(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a serial number") from None
    if not 1 <= n <= MAX_SERIAL:
        raise argparse.ArgumentTypeError(f"serial must be 1..{MAX_SERIAL}")
    return n
