"""`meshd testnet up|down|status`: a local mesh of real daemons for trying meshd and testing it."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from meshd.errors import LocalError
from meshd.exitcodes import Exit
from meshd.paths import default_testnet_dir, last_testnet_dir

HELP = """\
Start N attested daemons on loopback in the background, with a fresh CA and fresh keys and an
embedded default config, and return once every node sees all the others. `meshd submit`,
`status`, `peers` and `explain` then reach the first node without any path.

Every node serves one model: the small one shipped with meshd (tiny-en, fast to start), or the
one --model names: a catalog name (`meshd model catalog`; pulled into the models folder first
when missing, as `meshd model pull` does, from $MESHD_WHEELHOUSE when set), a model of the
models folder, or a model directory. It serves at tier "large" (the testnet's only and so top
tier), so that `meshd submit --model auto` is answered (docs/tiers.md).

  meshd testnet up --nodes 3 --model smollm2-135m-instruct

With --scenario FILE (see docs/testnet.md and testnet/regions-12.toml) the nodes, regions, speeds
and models come from the file, and each daemon runs in its own network namespace with its own
address; a user-space link emulator gives every pair of nodes the scenario's round-trip time,
jitter and loss. Without root or the `ip` tool it falls back to loopback without emulation and
says so.
"""


def register(sub: Any) -> None:
    p = sub.add_parser("testnet", help="start/stop a local mesh of daemons", description=HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    tsub = p.add_subparsers(dest="testnet_command", metavar="ACTION")
    up = tsub.add_parser("up", help="start a local mesh", description=HELP,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    up.add_argument("--nodes", "-n", type=int, default=3, help="number of daemons (default 3)")
    up.add_argument("--dir", help=f"state directory (default {default_testnet_dir()})")
    up.add_argument("--model", "-m", metavar="NAME",
                    help="the model every node serves: a catalog name, a model of the models "
                         "folder, or a model directory (default: `default`, the shipped tiny-en)")
    up.add_argument("--scenario", help="a testnet scenario file (regions, RTT matrix, nodes)")
    up.add_argument("--isolation", choices=("auto", "netns", "loopback"), default="auto",
                    help="with --scenario: network namespaces with emulated links (netns), plain "
                         "loopback, or netns where possible (auto, the default)")
    up.add_argument("--advert-interval", type=float, default=None,
                    help="advert interval in seconds (default 2, or the scenario's)")
    up.set_defaults(func=run_up)
    down = tsub.add_parser("down", help="stop a local mesh",
                           description="Stop the daemons of a testnet (SIGTERM, then SIGKILL).")
    down.add_argument("--dir", help="state directory (default: the last testnet started)")
    down.set_defaults(func=run_down)
    p.set_defaults(func=lambda a: (p.print_help(), int(Exit.USAGE))[1])


def run_up(args: argparse.Namespace) -> int:
    from meshd.testnet.launcher import default_specs, down, running_daemons, up

    directory = (Path(args.dir) if args.dir else default_testnet_dir()).resolve()
    if args.advert_interval is not None and args.advert_interval <= 0:
        raise LocalError("--advert-interval must be > 0")
    if args.scenario and args.model:
        raise LocalError("--model: a scenario names its nodes' models itself")
    if not args.scenario and args.nodes < 1:
        raise LocalError("--nodes must be at least 1")
    model = _model_for(args.model or "default") if not args.scenario else "default"
    if running_daemons(directory):  # `up` twice in a row replaces the mesh, keeping its keys
        print(f"stopping the testnet already running in {directory}")
        down(directory)
    if args.scenario:
        from meshd.testnet.scenario import load_scenario
        from meshd.testnet.scenario_up import up_scenario

        scenario = load_scenario(args.scenario)
        index = up_scenario(directory, scenario, isolation=args.isolation,
                            advert_interval_s=args.advert_interval)
    else:
        index = up(directory, default_specs(args.nodes, model),
                   advert_interval_s=args.advert_interval or 2.0)
    print(f"testnet of {len(index['nodes'])} nodes is up in {index['dir']}")
    net = index.get("network")
    if net is not None and net["mode"] == "netns":
        print(f"network: one namespace per node ({net['prefix']}-*), links emulated in user space "
              f"by the forwarder (pid {net['forwarder_pid']}) in {net['router']}")
    elif net is not None:
        print(f"network: LOOPBACK, NO LATENCY EMULATION ({net['reason']}); "
              "every link is as fast as loopback")
    for n in index["nodes"]:
        region = f"[{n['region']}]" if index.get("scenario") else ""
        print(f"  {n['name']:<10} {region:<8} {n['addr']}")
        print(f"  {'':<10} socket {n['socket']}  log {n['dir']}/meshd.log")
        if n.get("api_url"):
            print(f"  {'':<10} api    {n['api_url']}")
            print(f"  {'':<10} ui     {console_url(n['api_url'])}")
    served = _served(model) if not args.scenario else None
    if served is not None and served.chat and model != "default":  # tiny-en only continues text
        print('try:  meshd submit --chat "Name three primary colors."      (reaches the first '
              'node)')
    else:
        print('try:  meshd submit "Once upon a time"      (reaches the first node)')
    if served is not None:
        print(f"      meshd submit --model auto \"Once upon a time\"      ({served.name} at tier "
              "large)")
    print(f"      meshd peers --socket {index['nodes'][-1]['socket']}")
    if index.get("api_key_file"):
        first = index["nodes"][0]["api_url"]
        print(f"      curl -s {first}/completions -H \"Authorization: Bearer $(cat "
              f"{index['api_key_file']})\" -H 'content-type: application/json' \\")
        name = served.name if served is not None else "tiny-en"
        print(f"        -d '{{\"model\": \"{name}\", \"prompt\": \"And God said\"}}'")
        print(f"      (OpenAI clients: base_url {first}, api_key in {index['api_key_file']})")
        print(f"web console: {console_url(first)}      (it asks for the key in {index['api_key_file']})")
    print(f"stop: meshd testnet down --dir {index['dir']}")
    return Exit.OK


def console_url(api_url: str) -> str:
    """The web console of the node whose API is at ``api_url`` (``http://HOST:PORT/v1``)."""
    return api_url.removesuffix("/v1") + "/ui/"


def _model_for(text: str) -> str:
    """The [[models]] path for ``--model``: ``default``, or a model directory; a catalog model
    missing from the models folder is pulled first (from $MESHD_WHEELHOUSE when set)."""
    from meshd.models.local import choose_model
    from meshd.paths import models_home

    choice = choose_model(text, models_home())
    if choice.pull is not None:
        from meshd.models.pull import pull

        house = os.environ.get("MESHD_WHEELHOUSE")
        print(f"{choice.pull.name} is not in {models_home()}: pulling it", flush=True)
        got = pull(choice.pull, models_home(), wheelhouse=Path(house) if house else None,
                   say=lambda line: print(line, flush=True))
        print(f"pulled {got.entry.name} -> {got.path} ({got.seconds:.1f} s)")
    return choice.path


def _served(model: str) -> Any:
    """What the nodes serve (``meshd.models.local.LocalModel``), None when it cannot be read."""
    from meshd.models.local import DEFAULT, describe
    from meshd.node.engine_model import default_model_dir

    m = describe(default_model_dir() if model == DEFAULT else Path(model))
    return None if m.problem else m


def run_down(args: argparse.Namespace) -> int:
    from meshd.testnet.launcher import down

    directory = Path(args.dir) if args.dir else last_testnet_dir()
    if directory is None:
        raise LocalError("no testnet to stop (none started, or pass --dir)")
    from meshd.testnet import netns

    had_net = netns.load_state(directory) is not None
    stopped = down(directory)
    print(f"stopped {len(stopped)} daemons in {directory}")
    if had_net:
        left = netns.namespaces(netns.prefix_for(directory))
        if left:
            raise LocalError(f"could not remove network namespaces: {', '.join(left)}")
        print("removed the network namespaces, links and the link emulator")
    return Exit.OK
