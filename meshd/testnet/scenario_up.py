"""`meshd testnet up --scenario FILE`: start a scenario's daemons, each in its own network
namespace behind the user-space link emulator, or on loopback (no emulation) where namespaces
cannot be used. ``launcher.down`` removes both the daemons and the network.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from meshd.errors import LocalError
from meshd.testnet import netns
from meshd.testnet.launcher import NodeSpec, check_not_running, up
from meshd.testnet.scenario import LinkSpec, Scenario

log = logging.getLogger(__name__)

NODE_PORT = 4001
ISOLATION = ("auto", "netns", "loopback")


def pair_links(scenario: Scenario) -> dict[tuple[str, str], LinkSpec]:
    """The configured link of every unordered pair of nodes (by name)."""
    names = [n.name for n in scenario.nodes]
    return {(a, b): scenario.link(a, b) for i, a in enumerate(names) for b in names[i + 1:]}


def specs_for(scenario: Scenario, plan: netns.NetPlan | None) -> list[NodeSpec]:
    specs = []
    for n in scenario.nodes:
        spec = NodeSpec(name=n.name, region=n.region, labels=dict(n.labels), models=n.daemon_models(),
                        extra=n.daemon_config())
        if plan is not None:
            nn = next(x for x in plan.nodes if x.name == n.name)
            spec.host, spec.port, spec.netns = nn.ip, NODE_PORT, nn.netns
        specs.append(spec)
    return specs


def up_scenario(directory: Path, scenario: Scenario, *, isolation: str = "auto",
                advert_interval_s: float | None = None, wait: bool = True) -> dict[str, Any]:
    """Start ``scenario``; returns the testnet index, with ``network`` saying how links are made:
    ``{"mode": "netns", ...}`` (emulated) or ``{"mode": "loopback", "reason": ...}``."""
    if isolation not in ISOLATION:
        raise LocalError(f"isolation must be one of {', '.join(ISOLATION)}")
    directory = directory.resolve()
    check_not_running(directory)
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    reason = netns.unavailable_reason() if isolation != "loopback" else "--loopback was asked for"
    if reason is not None and isolation == "netns":
        raise LocalError(f"cannot isolate the nodes in network namespaces: {reason}")
    interval = advert_interval_s or scenario.advert_interval_s
    meta: dict[str, Any] = {"scenario": scenario.source, "scenario_name": scenario.name}
    if reason is not None:
        meta["network"] = {"mode": "loopback", "reason": reason}
        log.warning("testnet on loopback without link emulation reason=%s", reason)
        return up(directory, specs_for(scenario, None), advert_interval_s=interval, wait=wait,
                  extra_index=meta)
    netns.teardown(directory)  # whatever a crashed run left under our prefix
    plan = netns.plan_network(netns.prefix_for(directory), [n.name for n in scenario.nodes])
    state: dict[str, Any] = {"prefix": plan.prefix, "plan": plan.to_json(), "forwarder_pid": None}
    netns.save_state(directory, state)  # before creating anything, so `down` can always clean up
    try:
        netns.create(plan)
        cfg = netns.forwarder_config(plan, pair_links(scenario), seed=scenario.seed, directory=directory)
        state["forwarder_pid"] = netns.start_forwarder(plan, cfg, directory)
        netns.save_state(directory, state)
        meta["network"] = {"mode": "netns", "prefix": plan.prefix, "router": plan.router,
                           "forwarder_pid": state["forwarder_pid"],
                           "stats": cfg["stats"]}
        return up(directory, specs_for(scenario, plan), advert_interval_s=interval, wait=wait,
                  extra_index=meta)
    except BaseException:
        from meshd.testnet.launcher import down

        try:
            down(directory)
        except LocalError:
            netns.teardown(directory)
        raise
