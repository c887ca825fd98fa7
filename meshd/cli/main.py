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
    ErrorCode,
    KeyFileError,
    LocalError,
    MeshdError,
    RegistryError,
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
    "audit",
    "cache",
    "rag",
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

Try it:  meshd testnet up --nodes 3 --model smollm2-135m-instruct && meshd submit --chat "Hi!"
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
    code = getattr(err, "code", None)
    if code in (ErrorCode.BUSY, ErrorCode.QUOTA, ErrorCode.DEADLINE):
        return Exit.TEMPFAIL  # try again later
    if code == ErrorCode.UNATTESTED:
        return Exit.NOPERM
    if code == ErrorCode.INTERNAL:
        return Exit.SOFTWARE
    if isinstance(err, RoutingError | RemoteError | RegistryError):
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
    except BaseException as exc:  # noqa: B036 - every failure ends as one line and an exit code
        return report(args.command, exc)


def report(command: str, exc: BaseException) -> int:
    """Print one line for ``exc`` and return its exit code. An error from inside the daemon's
    nurseries arrives wrapped in exception groups: the meshd error inside is what counts. Anything
    that is not a meshd error is a bug (exit 70); its traceback goes to the log at debug level
    (``-vv``) and never to the user's screen otherwise."""
    leaves = _leaves(exc)
    if any(isinstance(e, KeyboardInterrupt) for e in leaves):
        return Exit.INTERRUPTED
    if leaves and all(isinstance(e, BrokenPipeError) for e in leaves):
        return Exit.OK
    if any(isinstance(e, SystemExit) for e in leaves):
        raise exc
    ours = [e for e in leaves if isinstance(e, MeshdError)]
    if ours:
        code = getattr(ours[0], "code", None) if isinstance(ours[0], RemoteError) else None
        said = f" ({code})" if code and str(code) not in str(ours[0]) else ""  # proto/errors.md
        print(f"meshd {command}: {ours[0]}{said}", file=sys.stderr)
        return exit_code_for(ours[0])
    first = leaves[0] if leaves else exc
    logging.getLogger(__name__).debug("internal error", exc_info=exc)
    text = str(first).strip().splitlines()
    detail = f": {text[0]}" if text else ""
    print(f"meshd {command}: internal error: {type(first).__name__}{detail} (a bug in meshd; "
          "run again with -vv for the traceback and please report it)", file=sys.stderr)
    return Exit.SOFTWARE


def _leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions at the leaves of (possibly nested) exception groups, trio's Cancelled
    left out (it only says a sibling failed)."""
    import trio

    if isinstance(exc, BaseExceptionGroup):
        return [leaf for e in exc.exceptions for leaf in _leaves(e)]
    return [] if isinstance(exc, trio.Cancelled) else [exc]


def entry() -> None:
    sys.exit(main())
