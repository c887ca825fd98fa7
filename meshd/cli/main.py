"""``meshd`` entry point: parse, dispatch to one subcommand module, map errors to exit codes."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from meshd import __version__
from meshd.errors import (
    ConfigError,
    KeyFileError,
    LocalError,
    MeshdError,
    RemoteError,
    RoutingError,
)
from meshd.exitcodes import Exit

# Each name is a module in meshd.cli that defines register(subparsers) -> None; the parser it
# adds sets ``func`` to a callable taking the parsed args and returning an exit code.
SUBCOMMANDS = (
    "run",
    "submit",
    "status",
    "peers",
    "explain",
    "keys",
    "model",
    "embed",
    "testnet",
    "sim",
    "bench",
)

DESCRIPTION = """\
meshd: a peer-to-peer edge inference mesh.

Every node runs `meshd run`; nodes holding a certificate from the mesh's CA join one libp2p
gossip mesh, advertise what they serve, and route each request to the node (or the pipeline of
layer-range stages) with the best predicted time to first token.

Try it:  meshd testnet up --nodes 3 && meshd submit "Once upon a time"
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="meshd",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"meshd {__version__}")
    parser.add_argument(
        "-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        module = importlib.import_module(f"meshd.cli.{name}")
        module.register(sub)
    return parser


def exit_code_for(err: MeshdError) -> Exit:
    if isinstance(err, ConfigError):
        return Exit.CONFIG
    if isinstance(err, KeyFileError):
        return Exit.NOPERM
    if isinstance(err, RoutingError):
        return Exit.UNAVAILABLE
    if isinstance(err, RemoteError):
        return Exit.UNAVAILABLE
    if isinstance(err, LocalError):
        return Exit.FAILURE
    return Exit.FAILURE


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if not getattr(args, "func", None):
        parser.print_help()
        return Exit.USAGE
    try:
        return int(args.func(args))
    except MeshdError as err:
        print(f"meshd {args.command}: {err}", file=sys.stderr)
        return exit_code_for(err)
    except KeyboardInterrupt:
        return Exit.INTERRUPTED
    except BrokenPipeError:
        return Exit.OK


def entry() -> None:
    sys.exit(main())
