"""Start and stop a local mesh of real daemons (separate processes) on loopback.

``up`` issues a fresh CA and one identity per node, writes each node's config, starts every
daemon in the background, and returns once every node lists all the others. ``down`` stops
them (SIGTERM, then SIGKILL after a deadline). State lives in one directory with a
``testnet.json`` index; the last one started is remembered so `meshd submit` finds it.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from meshd.control.client import call
from meshd.core.messages import MessageType
from meshd.errors import LocalError, MeshdError
from meshd.paths import remember_testnet
from meshd.testnet.children import alive, log_tail, reap, track

READY_TIMEOUT_S = 90.0
API_KEY_FILE = "api-key"  # the testnet's HTTP API key, in plain text (mode 0600)
API_KEYS_FILE = "api-keys"  # its hash, the key file every node of the testnet reads
API_CLIENT = "testnet"  # the client name of that key


@dataclass
class NodeSpec:
    name: str
    region: str = "local"
    labels: dict[str, str] = field(default_factory=dict)
    models: list[dict[str, Any]] = field(default_factory=lambda: [{"path": "default"}])
    extra: dict[str, Any] = field(default_factory=dict)  # more config sections/keys
    host: str = "127.0.0.1"
    port: int = 0
    netns: str | None = None
    api_port: int = 0  # the HTTP API's port (0: up() picks a free one)


# `meshd testnet up` without --scenario: every node serves one model, and that model carries a
# tier so that `meshd submit --model auto` is answered (docs/tiers.md). The mesh has no other
# model, so it is its top tier: "large"; a prompt the classifier finds simple wants "micro" and
# escalates to it (`meshd explain` says so), a complex one is served by it directly. With tier
# "micro" a complex prompt, or any prompt while the classifier is off, would find no tier.
TESTNET_TIER = "large"


def testnet_models(model: str = "default") -> list[dict[str, Any]]:
    """The [[models]] of each node of a plain testnet: ``model`` (a model directory, or
    ``default``: the shipped model, or $MESHD_DEFAULT_MODEL) at the testnet's tier."""
    return [{"path": model, "tier": TESTNET_TIER, "quality": 1.0}]


def default_specs(nodes: int, model: str = "default") -> list[NodeSpec]:
    """The nodes of `meshd testnet up --nodes N [--model M]`: node1..nodeN, each serving ``model``."""
    return [NodeSpec(name=f"node{i + 1}", models=testnet_models(model)) for i in range(nodes)]


_HANDED_OUT: set[int] = set()


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for the local ports of outgoing connections."""
    try:
        lo, hi = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        return lo, hi
    except (OSError, ValueError):
        return 32768, 60999


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on, for a daemon started a moment later. It is drawn below the
    kernel's ephemeral range: a port from that range (what binding to port 0 hands out) can be
    taken by any outgoing connection before the daemon binds it, the testnet's own daemons
    dialling each other included ("Address already in use" at start-up). Ports handed out
    earlier by this process are not handed out again."""
    lo, _ = ephemeral_range()
    low = 10_000 if lo > 12_000 else 1024
    rng = random.SystemRandom()
    for _ in range(500):
        port = rng.randrange(low, lo)
        if port in _HANDED_OUT:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # nothing free below: any
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {_toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def write_toml(sections: dict[str, Any]) -> str:
    lines: list[str] = [f"{name} = []" for name, body in sections.items() if body == []]
    for name, body in sections.items():
        if isinstance(body, list):
            for item in body:
                lines.append(f"[[{name}]]")
                lines.extend(f"{k} = {_toml_value(v)}" for k, v in item.items())
                lines.append("")
        else:
            lines.append(f"[{name}]")
            lines.extend(f"{k} = {_toml_value(v)}" for k, v in body.items())
            lines.append("")
    return "\n".join(lines)


def issue_keys(directory: Path, specs: list[NodeSpec]) -> dict[str, str]:
    """The folder's CA and one identity per node, kept from an earlier testnet in the same folder
    where still good, else issued (meshd/testnet/keys.py); returns name -> peer id."""
    from meshd.testnet.keys import prepare_keys

    return prepare_keys(directory, {s.name: {"region": s.region, **s.labels} for s in specs})


def node_config(spec: NodeSpec, node_dir: Path, bootstrap: list[str], *,
                advert_interval_s: float) -> dict[str, Any]:
    node = {
        "name": spec.name,
        "data_dir": str(node_dir / "state"),
        "socket": str(node_dir / "meshd.sock"),
        "listen": [f"/ip4/{spec.host}/tcp/{spec.port}"],
        "bootstrap": bootstrap,
    }
    sections: dict[str, Any] = {
        "node": node,
        "keys": {"identity": "node.key", "certificate": "node.cert", "ca": "ca.pub"},
        "gossip": {"advert_interval_s": advert_interval_s},
        "models": spec.models,
        # the testnet's one key (TESTNET_DIR/api-key) is in TESTNET_DIR/api-keys
        "api": {"listen": f"{spec.host}:{spec.api_port}", "keys_file": str(node_dir.parent / API_KEYS_FILE)},
    }
    if os.environ.get("MESHD_TESTNET_CACHE", "1") == "0":  # the test suite: no embedding model
        sections["cache"] = {"enabled": False}  # per daemon unless a spec turns it on
    for k, v in spec.extra.items():
        if isinstance(v, dict) and isinstance(sections.get(k), dict):
            sections[k] = {**sections[k], **v}
        else:
            sections[k] = v
    return sections


def start_process(node_dir: Path, *, netns: str | None = None, env: dict[str, str] | None = None) -> int:
    cmd = [sys.executable, "-m", "meshd", "run", "--config", str(node_dir / "meshd.toml")]
    if netns:
        cmd = ["ip", "netns", "exec", netns, *cmd]
    e = dict(os.environ)
    e.setdefault("PY_YAMUX_RELEASE_ON_READ", "0")
    e.update(env or {})
    with open(node_dir / "meshd.log", "ab") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env=e)
    track(proc)  # reaped by down()
    (node_dir / "meshd.pid").write_text(str(proc.pid))
    return proc.pid


async def wait_mesh(sockets: dict[str, Path], pids: dict[str, int], expect: int,
                    timeout_s: float = READY_TIMEOUT_S, node_dirs: dict[str, Path] | None = None) -> None:
    """Return once every node lists ``expect`` peers; raise naming the laggards."""
    deadline = trio.current_time() + timeout_s
    seen: dict[str, int] = {}
    while True:
        pending = []
        for name, sock in sockets.items():
            if not alive(pids[name]):
                tail = ""
                if node_dirs:
                    tail = log_tail(node_dirs[name] / "meshd.log")
                raise LocalError(f"node {name} exited during start-up:\n{tail}")
            try:
                with trio.fail_after(2):
                    reply = await call(str(sock), MessageType.PEERS_REQ, {})
                seen[name] = len(reply["peers"])
            except (MeshdError, trio.TooSlowError, OSError):
                seen[name] = -1
            if seen[name] < expect:
                pending.append(name)
        if not pending:
            return
        if trio.current_time() > deadline:
            detail = ", ".join(f"{n} sees {max(seen[n], 0)}" for n in pending)
            raise LocalError(f"mesh did not form within {timeout_s:.0f} s ({detail} of {expect} peers)")
        await trio.sleep(0.2)


def api_url(host: str, port: int) -> str:
    return f"http://{host}:{port}/v1"


def write_api_key(directory: Path) -> str:
    """A fresh HTTP API key for the testnet: the key in DIR/api-key (0600), its hash in
    DIR/api-keys (the key file of every node), for client ``testnet``."""
    from meshd.api.auth import add_key

    keys = directory / API_KEYS_FILE
    keys.unlink(missing_ok=True)
    key = add_key(keys, API_CLIENT)
    path = directory / API_KEY_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(key + "\n")
    return key


def running_daemons(directory: Path) -> set[int]:
    """Pids of the daemons of the testnet in ``directory`` that still run: those testnet.json
    lists, and any started again by hand there (meshd/testnet/procs.py)."""
    from meshd.testnet.procs import is_meshd_daemon, testnet_daemons

    if not directory.is_dir():
        return set()
    try:
        nodes = json.loads((directory / "testnet.json").read_text()).get("nodes", [])
    except (OSError, ValueError):
        nodes = []
    listed = {n["pid"] for n in nodes if alive(n["pid"]) and is_meshd_daemon(n["pid"])}
    return listed | testnet_daemons(directory, [Path(n["socket"]) for n in nodes if "socket" in n])


def check_not_running(directory: Path) -> None:
    if running_daemons(directory):
        raise LocalError(f"a testnet is already running in {directory}; "
                         f"stop it with `meshd testnet down --dir {directory}`")


BOOT_WAIT_S = 30.0
DEFAULT_API_PORT = 8080


def _wait_listening(sock: Path, pid: int, timeout_s: float) -> None:
    """Until the daemon's control socket exists (it binds its libp2p port before), it exits, or
    ``timeout_s`` passes; never raises: ``wait_mesh`` reports a node that did not come up."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not sock.exists() and alive(pid):
        time.sleep(0.05)


def up(directory: Path, specs: list[NodeSpec], *, advert_interval_s: float = 2.0,
       wait: bool = True, env_for: dict[str, dict[str, str]] | None = None,
       extra_index: dict[str, Any] | None = None, start_gap_s: float = 0.0) -> dict[str, Any]:
    """Start the daemons of ``specs``; ``extra_index`` is recorded in testnet.json (the scenario
    launcher notes its network there). Nodes with ``netns`` set run in that namespace.
    ``start_gap_s`` spaces the starts (a mesh whose nodes come up over a while, not at once)."""
    directory = directory.resolve()
    check_not_running(directory)
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    for s in specs:
        if not s.port:
            s.port = free_port(s.host)
        if not s.api_port:
            # a node in its own network namespace has its own ports (its address cannot be
            # bound from here to find a free one)
            s.api_port = DEFAULT_API_PORT if s.netns else free_port(s.host)
    ids = issue_keys(directory, specs)
    write_api_key(directory)
    first = specs[0]
    boot = [f"/ip4/{first.host}/tcp/{first.port}/p2p/{ids[first.name]}"]
    nodes = []
    pids: dict[str, int] = {}
    sockets: dict[str, Path] = {}
    dirs: dict[str, Path] = {}
    for i, s in enumerate(specs):
        d = directory / s.name
        cfg = node_config(s, d, [] if i == 0 else boot, advert_interval_s=advert_interval_s)
        (d / "meshd.toml").write_text(write_toml(cfg))
        if i > 1 and start_gap_s > 0:
            time.sleep(start_gap_s)
        pid = start_process(d, netns=s.netns, env=(env_for or {}).get(s.name))
        if i == 0 and len(specs) > 1:
            # the others dial it at once: a dial that finds nothing listening costs a retry
            # (seconds) where waiting for its control socket (it listens first) costs ~1 s
            _wait_listening(d / "meshd.sock", pid, BOOT_WAIT_S)
        pids[s.name] = pid
        sockets[s.name] = d / "meshd.sock"
        dirs[s.name] = d
        nodes.append({"name": s.name, "peer_id": ids[s.name], "pid": pid, "socket": str(d / "meshd.sock"),
                      "addr": f"/ip4/{s.host}/tcp/{s.port}/p2p/{ids[s.name]}", "region": s.region,
                      "dir": str(d), "netns": s.netns, "host": s.host,
                      "api_url": api_url(s.host, s.api_port)})
    index = {"dir": str(directory), "nodes": nodes, "started": time.time(),
             "api_key_file": str(directory / API_KEY_FILE), **(extra_index or {})}
    (directory / "testnet.json").write_text(json.dumps(index, indent=2))
    remember_testnet(directory)
    if wait:
        try:
            trio.run(wait_mesh, sockets, pids, len(specs) - 1, READY_TIMEOUT_S, dirs)
        except BaseException:
            down(directory)
            raise
    return index


def down(directory: Path, timeout_s: float = 10.0) -> list[str]:
    """Stop the daemons, then remove the emulated network (namespaces, forwarder) if any.

    The daemons are those testnet.json lists and every other one of this folder still running:
    restarted by hand with a config or a control socket in it (meshd/testnet/procs.py)."""
    from meshd.testnet import netns, procs

    try:
        index: dict[str, Any] | None = json.loads((directory / "testnet.json").read_text())
    except (OSError, ValueError):
        index = None
    listed = [Path(n["socket"]) for n in index["nodes"]] if index else []
    extra = procs.testnet_daemons(directory, listed) if directory.is_dir() else set()
    if index is None and not extra:
        if netns.load_state(directory) is not None:  # a scenario `up` that failed early
            netns.teardown(directory)
            return []
        raise LocalError(f"no testnet in {directory}")
    try:
        return _stop_daemons(index["nodes"] if index else [], extra, timeout_s)
    finally:
        if netns.load_state(directory) is not None:
            netns.teardown(directory)


def stop_node(directory: Path, name: str, timeout_s: float = 10.0) -> bool:
    """Stop one daemon of the testnet in ``directory`` as ``down`` stops them all (SIGTERM,
    SIGKILL after ``timeout_s``), leaving the others running; False when it was not running."""
    try:
        nodes = json.loads((directory / "testnet.json").read_text())["nodes"]
    except (OSError, ValueError, KeyError):
        raise LocalError(f"no testnet in {directory}") from None
    node = next((n for n in nodes if n["name"] == name), None)
    if node is None:
        raise LocalError(f"no node {name} in the testnet in {directory}")
    return bool(_stop_daemons([node], set(), timeout_s))


def _stop_daemons(nodes: list[dict[str, Any]], extra: set[int], timeout_s: float) -> list[str]:
    """SIGTERM (after SIGCONT, for a frozen one) each daemon: the listed ``nodes`` whose pid still
    runs meshd, and the pids in ``extra``; SIGKILL whatever is left after ``timeout_s``."""
    from meshd.testnet.procs import is_meshd_daemon

    targets: dict[int, str] = {}
    for n in nodes:
        if alive(n["pid"]) and (n["pid"] in extra or is_meshd_daemon(n["pid"])):
            targets[n["pid"]] = n["name"]
    for pid in sorted(extra - set(targets)):
        targets[pid] = f"pid {pid}"
    stopped = []
    for pid, name in targets.items():
        try:
            os.kill(pid, signal.SIGCONT)
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            continue
        stopped.append(name)
    deadline = time.monotonic() + timeout_s
    for pid in targets:
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if alive(pid):
            _kill(pid)
    for n in nodes:
        reap(n["pid"])
    for pid in targets:
        reap(pid)
    return stopped


def _kill(pid: int) -> None:
    """SIGKILL a daemon, with its process group when it leads one (`up` starts each in its own
    session); a daemon started by hand shares its shell's group, which must be left alone."""
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
