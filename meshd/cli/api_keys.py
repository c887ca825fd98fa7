"""`meshd keys api-key create|list|revoke`: the bearer keys of the HTTP API (docs/api.md).

A key maps to a client name; the per-client quotas of ``[routing] quotas`` count against it. The
key is printed once, on standard output alone; the key file keeps only its hash. A running
daemon reads the file again when it changes, so no restart is needed.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from meshd.errors import LocalError
from meshd.exitcodes import Exit

DESCRIPTION = """\
API keys of the OpenAI-compatible HTTP API. Each key is a bearer token mapped to a client name;
per-client quotas ([routing] quotas) count against that name. The key file named by the node's
[api] keys_file (default "api-keys" beside the config file) keeps only SHA-256 hashes.

  meshd keys api-key create alice --config /etc/meshd/meshd.toml
  meshd keys api-key list --file /etc/meshd/api-keys
  meshd keys api-key revoke alice --config /etc/meshd/meshd.toml
"""


def register(ks: Any) -> None:
    """Add ``api-key`` under ``meshd keys`` (``ks`` is its subparsers)."""
    p = ks.add_parser("api-key", help="create, list and revoke keys of the HTTP API",
                      description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="api_key_command", metavar="ACTION")
    p.set_defaults(func=lambda a: (p.print_help(), int(Exit.USAGE))[1])

    def where(q: argparse.ArgumentParser) -> None:
        g = q.add_mutually_exclusive_group()
        g.add_argument("--file", type=Path, help="the key file")
        g.add_argument("--config", type=Path,
                       help="a node's config file: use its [api] keys_file")

    q = sub.add_parser("create", help="make a key for a client and print it once",
                       description="Make a new key for client NAME, add its hash to the key file "
                       "(created mode 0600) and print the key on standard output. It is never "
                       "shown again; a client may have several keys.")
    q.add_argument("name", metavar="NAME", help="client name (letters, digits, . _ -)")
    where(q)
    q.add_argument("--json", action="store_true", help="print {name, key, file} as JSON")
    q.set_defaults(func=run_create)
    q = sub.add_parser("list", help="list the client names that have keys (never the keys)")
    where(q)
    q.add_argument("--json", action="store_true", help="print one JSON array")
    q.set_defaults(func=run_list)
    q = sub.add_parser("revoke", help="remove every key of a client",
                       description="Remove every key of client NAME from the key file; a running "
                       "daemon refuses them from its next request on.")
    q.add_argument("name", metavar="NAME")
    where(q)
    q.set_defaults(func=run_revoke)


def key_file(args: argparse.Namespace) -> Path:
    if args.file is not None:
        return Path(args.file)
    if args.config is not None:
        from meshd.config import load_config

        cfg = load_config(args.config)
        return cfg.path(cfg.api.keys_file)
    raise LocalError("name the key file with --file FILE, or the node's config with --config FILE")


def run_create(args: argparse.Namespace) -> int:
    import sys

    from meshd.api.auth import add_key

    path = key_file(args)
    key = add_key(path, args.name)
    if args.json:
        print(json.dumps({"name": args.name, "key": key, "file": str(path)}))
    else:
        print(key)
        print(f"created an API key for client {args.name} in {path}; it is shown only this once",
              file=sys.stderr)
    return int(Exit.OK)


def run_list(args: argparse.Namespace) -> int:
    from meshd.api.auth import key_entries

    entries = key_entries(key_file(args))
    if args.json:
        print(json.dumps([{"name": n, "created": c} for n, c in entries]))
    else:
        for n, c in entries:
            print(f"{n:<24} {c}")
    return int(Exit.OK)


def run_revoke(args: argparse.Namespace) -> int:
    from meshd.api.auth import remove_keys

    path = key_file(args)
    n = remove_keys(path, args.name)
    if n == 0:
        raise LocalError(f"client {args.name!r} has no key in {path}")
    print(f"removed {n} key(s) of client {args.name} from {path}")
    return int(Exit.OK)
