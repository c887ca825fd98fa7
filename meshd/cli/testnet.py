"""`meshd testnet up|down|status`: a local mesh of real daemons for trying meshd and testing it."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from meshd.errors import LocalError
from meshd.exitcodes import Exit
from meshd.paths import default_testnet_dir, last_testnet_dir

HELP = """\
Start N attested daemons on loopback in the background, with a fresh CA and fresh keys and an
embedded default config (every node serves the shipped model), and return once every node sees
all the others. `meshd submit`, `status`, `peers` and `explain` then reach the first node
without any path. (--scenario, for regions and emulated link latency, is not built yet.)
"""


def register(sub: Any) -> None:
    p = sub.add_parser("testnet", help="start/stop a local mesh of daemons", description=HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    tsub = p.add_subparsers(dest="testnet_command", metavar="ACTION")
    up = tsub.add_parser("up", help="start a local mesh", description=HELP,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    up.add_argument("--nodes", "-n", type=int, default=3, help="number of daemons (default 3)")
    up.add_argument("--dir", help=f"state directory (default {default_testnet_dir()})")
    up.add_argument("--scenario", help="a testnet scenario file (not built yet: gives a clear error)")
    up.add_argument("--advert-interval", type=float, default=2.0,
                    help="advert interval in seconds (default 2)")
    up.set_defaults(func=run_up)
    down = tsub.add_parser("down", help="stop a local mesh",
                           description="Stop the daemons of a testnet (SIGTERM, then SIGKILL).")
    down.add_argument("--dir", help="state directory (default: the last testnet started)")
    down.set_defaults(func=run_down)
    p.set_defaults(func=lambda a: (p.print_help(), int(Exit.USAGE))[1])


def run_up(args: argparse.Namespace) -> int:
    from meshd.testnet.launcher import NodeSpec, up

    directory = Path(args.dir) if args.dir else default_testnet_dir()
    if args.scenario:
        raise LocalError("--scenario testnets (regions, emulated link latency) are not built yet; "
                         "use --nodes N")
    else:
        if args.nodes < 1:
            raise LocalError("--nodes must be at least 1")
        specs = [NodeSpec(name=f"node{i + 1}") for i in range(args.nodes)]
        index = up(directory, specs, advert_interval_s=args.advert_interval)
    print(f"testnet of {len(index['nodes'])} nodes is up in {index['dir']}")
    for n in index["nodes"]:
        print(f"  {n['name']:<10} {n['addr']}")
        print(f"  {'':<10} socket {n['socket']}  log {n['dir']}/meshd.log")
    print('try:  meshd submit "Once upon a time"      (reaches the first node)')
    print(f"      meshd peers --socket {index['nodes'][-1]['socket']}")
    print(f"stop: meshd testnet down --dir {index['dir']}")
    return Exit.OK


def run_down(args: argparse.Namespace) -> int:
    from meshd.testnet.launcher import down

    directory = Path(args.dir) if args.dir else last_testnet_dir()
    if directory is None:
        raise LocalError("no testnet to stop (none started, or pass --dir)")
    stopped = down(directory)
    print(f"stopped {len(stopped)} daemons in {directory}")
    return Exit.OK
