"""`meshd keys push-revocations [FILE]`: hand a revocation list to a running daemon, which
applies it and spreads it by gossip."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from meshd.cli.keys import options
from meshd.exitcodes import Exit


def register(ks: Any) -> None:
    q = ks.add_parser(
        "push-revocations",
        help="hand a revocation list to a running daemon, which spreads it by gossip",
        description="Send a CA-signed revocation list (default: DIR/revoked.crl, as written by "
        "`meshd keys revoke`) to a running daemon over its control socket. The daemon checks "
        "the CA signature, and if the list's version is newer than the one in force it applies "
        "it: it closes its connections to the revoked peers at once, drops them from its peer "
        "table, refuses their future connections, saves the list as data_dir/revocations.bin "
        "(so it holds across restarts) and gossips it; every other node does the same when the "
        "gossip reaches it, within seconds. One node is enough. A list whose version is not "
        "newer changes nothing. No CA private key is needed: the list carries its signature.",
        epilog="example: meshd keys revoke 7 && meshd keys push-revocations --socket "
        "/run/meshd/meshd.sock",
    )
    q.add_argument(
        "file",
        metavar="FILE",
        type=Path,
        nargs="?",
        default=None,
        help="the revocation list to push (default: DIR/revoked.crl)",
    )
    options.add_dir(q)
    q.add_argument(
        "--socket",
        metavar="PATH",
        help="control socket of the daemon to hand it to (default: $MESHD_SOCKET, the system "
        "daemon's /run/meshd/meshd.sock, else the first node of the last `meshd testnet up`)",
    )
    q.add_argument("--json", action="store_true", help="print one JSON object")
    q.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import trio

    from meshd import ca
    from meshd.control.client import call, find_socket
    from meshd.core.messages import MessageType
    from meshd.errors import LocalError, RemoteError

    path = Path(args.file) if args.file is not None else ca.revocation_file(options.ca_dir(args))
    rl, data = ca.read_revocation_list(path)
    sock = find_socket(args.socket)
    try:
        reply = trio.run(call, str(sock), MessageType.PUSH_REVOCATION, {"crl": data})
    except RemoteError as err:
        if err.code in ("malformed", "unattested"):
            # the daemon checked the list and refused it (another CA, bad signature)
            raise LocalError(f"the daemon refused {path}: {err}") from None
        raise
    info = dict(reply.get("data") or {})
    in_force = int(info.get("version") or 0)
    gone = [str(p) for p in info.get("disconnected") or []]
    node = f"the daemon at {sock}"
    result = {
        "file": str(path),
        "socket": str(sock),
        "pushed_version": rl.version,
        "version_in_force": in_force,
        "applied": in_force == rl.version,
        "newer_in_force": in_force > rl.version,
        "disconnected": gone,
        "revoked_serials": sorted(rl.serials),
    }
    if args.json:
        print(json.dumps(result))
        return int(Exit.OK)
    if in_force > rl.version:
        print(f"{node} already holds version {in_force}, newer than {path} (version "
              f"{rl.version}); nothing changed")
        return int(Exit.OK)
    print(f"revocation list version {rl.version} ({len(rl.serials)} serial(s)) in force on {node}")
    print(f"  disconnected {len(gone)} peer(s) now" + (f": {', '.join(gone)}" if gone else ""))
    print("  the list spreads by gossip; every node closes its connections to revoked peers")
    return int(Exit.OK)
