"""Network namespaces for a testnet: one per node, a router namespace between them, and the
user-space link emulator (``meshd.testnet.forwarder``) in the router.

Layout for a testnet with prefix P (derived from its directory, so a second testnet elsewhere
never collides and ``down`` finds everything by name even after a failed ``up``)::

    P-1 (node 1)  eth0 10.77.1.2/24 --veth-- v1 10.77.1.1/24 \\
    P-2 (node 2)  eth0 10.77.2.2/24 --veth-- v2 10.77.2.1/24  >  P-r (router): tun mdtun
    ...                                                       /  + forwarder process

In the router, ``ip rule add iif vN lookup 100`` sends everything a node sends to table 100,
whose only route is the TUN device; the forwarder reads each packet from the TUN, holds it for
the pair's emulated delay and writes it back; the kernel then routes it by the main table's
connected routes to the destination's veth. Every name created starts with P, and every veth
lives inside a namespace, so deleting the namespaces removes everything.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from meshd.errors import LocalError
from meshd.testnet.children import log_tail, reap, track

SUBNET = "10.77"
TUN = "mdtun"
TABLE = 100
RULE_PRIORITY = 100
NET_STATE = "network.json"
CMD_TIMEOUT_S = 20.0


@dataclass(frozen=True)
class NodeNet:
    name: str
    netns: str
    ip: str
    router_ip: str
    router_veth: str  # the node's veth end inside the router namespace
    node_veth: str = "eth0"


@dataclass(frozen=True)
class NetPlan:
    prefix: str
    router: str
    nodes: tuple[NodeNet, ...]
    tun: str = TUN
    table: int = TABLE

    def address(self, name: str) -> str:
        for n in self.nodes:
            if n.name == name:
                return n.ip
        raise KeyError(name)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> NetPlan:
        return cls(prefix=d["prefix"], router=d["router"], tun=d["tun"], table=d["table"],
                   nodes=tuple(NodeNet(**n) for n in d["nodes"]))


def prefix_for(directory: Path) -> str:
    """Short, stable name prefix for the testnet in ``directory`` (namespace names are global)."""
    return "md" + hashlib.sha1(str(directory.resolve()).encode()).hexdigest()[:6]


def plan_network(prefix: str, names: list[str]) -> NetPlan:
    if len(names) > 250:
        raise LocalError("at most 250 namespaced nodes")
    nodes = tuple(
        NodeNet(name=n, netns=f"{prefix}-{i}", ip=f"{SUBNET}.{i}.2", router_ip=f"{SUBNET}.{i}.1",
                router_veth=f"v{i}")
        for i, n in enumerate(names, start=1)
    )
    return NetPlan(prefix=prefix, router=f"{prefix}-r", nodes=nodes)


def unavailable_reason() -> str | None:
    """Why namespaces cannot be used here, or None if they can."""
    if not sys.platform.startswith("linux"):
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "the `ip` tool (iproute2) is not installed"
    if not Path("/dev/net/tun").exists():
        return "/dev/net/tun is missing (needed for link emulation)"
    try:
        r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=CMD_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"`ip netns list` failed: {e}"
    if r.returncode != 0:
        return f"`ip netns list` failed: {r.stderr.strip()}"
    return None


def _ip(*args: str) -> None:
    cmd = ["ip", *args]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=CMD_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise LocalError(f"`{' '.join(cmd)}` failed: {e}") from None
    if r.returncode != 0:
        raise LocalError(f"`{' '.join(cmd)}` failed: {r.stderr.strip() or r.returncode}")


def _sysctl(ns: str, *settings: str) -> None:
    _ip("netns", "exec", ns, "sysctl", "-q", "-w", *settings)


def create(plan: NetPlan) -> None:
    """Create the namespaces, veths, TUN and routes of ``plan`` (not the forwarder)."""
    r = plan.router
    _ip("netns", "add", r)
    _ip("-n", r, "link", "set", "lo", "up")
    # rp_filter would drop packets coming back out of the TUN (their source is behind a veth);
    # "default" applies to interfaces created after it, which is all of ours
    _sysctl(r, "net.ipv4.ip_forward=1", "net.ipv4.conf.all.rp_filter=0",
            "net.ipv4.conf.default.rp_filter=0", "net.ipv4.conf.all.send_redirects=0",
            "net.ipv4.conf.default.send_redirects=0")
    _ip("-n", r, "tuntap", "add", "dev", plan.tun, "mode", "tun")
    _ip("-n", r, "link", "set", plan.tun, "up")
    _ip("-n", r, "route", "add", "default", "dev", plan.tun, "table", str(plan.table))
    for n in plan.nodes:
        _ip("netns", "add", n.netns)
        _ip("-n", n.netns, "link", "set", "lo", "up")
        _ip("-n", r, "link", "add", n.router_veth, "type", "veth", "peer", "name", n.node_veth,
            "netns", n.netns)
        _ip("-n", r, "addr", "add", f"{n.router_ip}/24", "dev", n.router_veth)
        _ip("-n", r, "link", "set", n.router_veth, "up")
        _ip("-n", n.netns, "addr", "add", f"{n.ip}/24", "dev", n.node_veth)
        _ip("-n", n.netns, "link", "set", n.node_veth, "up")
        _ip("-n", n.netns, "route", "add", "default", "via", n.router_ip)
        _ip("-n", r, "rule", "add", "iif", n.router_veth, "lookup", str(plan.table),
            "priority", str(RULE_PRIORITY))


def namespaces(prefix: str) -> list[str]:
    """Our namespaces that exist now (by name prefix)."""
    try:
        r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=CMD_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return []
    names = [line.split()[0] for line in r.stdout.splitlines() if line.strip()]
    return sorted(n for n in names if n == f"{prefix}-r" or n.startswith(f"{prefix}-"))


def _pids_in(ns: str) -> list[int]:
    try:
        r = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=CMD_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [int(x) for x in r.stdout.split() if x.isdigit()]


def destroy(prefix: str, timeout_s: float = 10.0) -> list[str]:
    """Stop every process left in our namespaces (the daemons and the forwarder we started in
    them), then delete the namespaces; their veths, TUN, routes and rules go with them."""
    found = namespaces(prefix)
    pids = {p for ns in found for p in _pids_in(ns)}
    for p in pids:
        _signal(p, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(_exists(p) for p in pids):
        time.sleep(0.05)
    for p in pids:
        if _exists(p):
            _signal(p, signal.SIGKILL)
    for p in pids:
        try:
            os.waitpid(p, os.WNOHANG)
        except ChildProcessError:
            pass
    for ns in found:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=CMD_TIMEOUT_S)
    return found


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _exists(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def forwarder_config(plan: NetPlan, links: dict[tuple[str, str], Any], *, seed: int, directory: Path,
                     reorder: bool = False) -> dict[str, Any]:
    """The forwarder's JSON config: directed (src ip, dst ip, delay, jitter, loss) rows."""
    from meshd.testnet.netem import OneWay

    rows = []
    for (a, b), spec in sorted(links.items()):
        one = OneWay.from_link(spec)
        for x, y in ((a, b), (b, a)):
            rows.append([plan.address(x), plan.address(y), one.delay_ms, one.jitter_ms, one.loss_pct])
    return {"tun": plan.tun, "seed": seed, "reorder": reorder, "links": rows,
            "stats": str(directory / "forwarder-stats.json"), "ready": str(directory / "forwarder.ready")}


def start_forwarder(plan: NetPlan, cfg: dict[str, Any], directory: Path, timeout_s: float = 15.0) -> int:
    """Start the forwarder in the router namespace; return its pid once it holds the TUN."""
    path = directory / "forwarder.json"
    path.write_text(json.dumps(cfg, indent=1))
    ready = Path(cfg["ready"])
    ready.unlink(missing_ok=True)
    cmd = ["ip", "netns", "exec", plan.router, sys.executable, "-m", "meshd.testnet.forwarder", str(path)]
    with open(directory / "forwarder.log", "ab") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    track(proc)
    deadline = time.monotonic() + timeout_s
    while not ready.exists():
        if proc.poll() is not None:
            raise LocalError("the link emulator exited at start:\n" + log_tail(directory / "forwarder.log"))
        if time.monotonic() > deadline:
            raise LocalError(f"the link emulator did not start within {timeout_s:.0f} s")
        time.sleep(0.05)
    return proc.pid


def save_state(directory: Path, state: dict[str, Any]) -> None:
    (directory / NET_STATE).write_text(json.dumps(state, indent=1))


def load_state(directory: Path) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads((directory / NET_STATE).read_text())
        return data
    except (OSError, ValueError):
        return None


def teardown(directory: Path) -> list[str]:
    """Remove the network of the testnet in ``directory`` (idempotent); returns namespaces deleted."""
    state = load_state(directory)
    prefix = state["prefix"] if state else prefix_for(directory)
    if state and state.get("forwarder_pid"):
        pid = int(state["forwarder_pid"])
        if _exists(pid):
            _signal(pid, signal.SIGTERM)
            deadline = time.monotonic() + 5
            while _exists(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            if _exists(pid):
                _signal(pid, signal.SIGKILL)
        reap(pid)
    if unavailable_reason() is not None and state is None:
        return []
    gone = destroy(prefix)
    (directory / NET_STATE).unlink(missing_ok=True)
    return gone
