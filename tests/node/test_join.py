"""A joining daemon learns the mesh from its first links (SYNC), not from the next advert period.

Adverts here are 120 s apart. The mesh of three is up (their periodic adverts are spent) when a
fourth daemon starts: without the SYNC exchange on a new link it would see nobody, and nobody
would list it beyond its bootstrap peer, for up to two minutes; with it, all four see each other
within seconds. Real daemons, real libp2p, loopback; no model is loaded.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import trio

from meshd.cli.main import main
from meshd.control.client import call
from meshd.core.messages import MessageType
from meshd.testnet import children, launcher

ADVERT_INTERVAL_S = 120.0
JOINS_WITHIN_S = 30.0  # far below one advert interval
# gossipsub re-offers messages from its cache for a few heartbeats (1 s each): let the three's
# first adverts age out of it, so that only SYNC can tell the joiner about them
MCACHE_AGE_S = 8.0


@pytest.fixture
def mesh_of_three(tmp_path: Path) -> Any:
    specs = [launcher.NodeSpec(name=f"j{i + 1}", models=[]) for i in range(3)]
    index = launcher.up(tmp_path / "net", specs, advert_interval_s=ADVERT_INTERVAL_S)
    try:
        yield index
    finally:
        launcher.down(tmp_path / "net")


def start_joiner(directory: Path, bootstrap: str) -> tuple[Path, int]:
    spec = launcher.NodeSpec(name="joiner", models=[], port=launcher.free_port())
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["keys", "issue", spec.name, "--dir", str(directory / "ca"),
                     "--out", str(directory / spec.name), "--label", "region=local"]) == 0
    node_dir = directory / spec.name
    cfg = launcher.node_config(spec, node_dir, [bootstrap], advert_interval_s=ADVERT_INTERVAL_S)
    (node_dir / "meshd.toml").write_text(launcher.write_toml(cfg))
    return node_dir, launcher.start_process(node_dir)


def test_a_late_joiner_sees_and_is_seen_by_all_well_before_one_advert_period(mesh_of_three: Any) -> None:
    directory = Path(mesh_of_three["dir"])
    nodes = mesh_of_three["nodes"]
    time.sleep(MCACHE_AGE_S)  # ageing the adverts, not waiting for readiness
    node_dir, pid = start_joiner(directory, nodes[0]["addr"])
    try:
        sockets = {n["name"]: Path(n["socket"]) for n in nodes} | {"joiner": node_dir / "meshd.sock"}
        pids = {n["name"]: n["pid"] for n in nodes} | {"joiner": pid}

        async def check() -> dict[str, Any]:
            await launcher.wait_mesh(sockets, pids, len(nodes), timeout_s=JOINS_WITHIN_S,
                                     node_dirs={"joiner": node_dir})
            with trio.fail_after(5):
                reply = await call(str(node_dir / "meshd.sock"), MessageType.STATUS_REQ, {})
            return dict(reply["data"])

        status = trio.run(check)
        # what the joiner knows of the three came by SYNC (their periodic adverts are 120 s off)
        assert status["services"]["node"]["adverts_synced"] >= len(nodes) - 1, status["services"]
        assert status["peers"] == len(nodes)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        children.reap(pid)
