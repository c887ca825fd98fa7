"""Acceptance of the daemon foundation with real daemons as separate processes on loopback.

One 5-node testnet is started for the module (it costs ~10 s); the tests that kill or freeze a
daemon put it back before they end. Every wait is on a condition with a deadline.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from meshd.testnet.children import alive, reap
from meshd.testnet.drive import cli as meshd
from meshd.testnet.drive import peers_of, wait_for
from meshd.testnet.launcher import NodeSpec, down, start_process, up

pytestmark = pytest.mark.slow

ADVERT_INTERVAL_S = 1.0
SOLO_MODEL = "tiny-solo"





@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Iterator[dict[str, Any]]:
    d = tmp_path_factory.mktemp("mesh5")
    specs = [NodeSpec(name=f"n{i + 1}") for i in range(5)]
    specs[4].models = [{"path": "default"}, {"path": "default", "name": SOLO_MODEL}]
    index = up(d, specs, advert_interval_s=ADVERT_INTERVAL_S)
    try:
        yield index
    finally:
        down(d)


def sockets(mesh: dict[str, Any]) -> dict[str, str]:
    return {n["name"]: n["socket"] for n in mesh["nodes"]}


def test_every_node_lists_the_other_four_with_fresh_adverts(mesh: dict[str, Any]) -> None:
    for name, sock in sockets(mesh).items():
        peers = peers_of(sock)
        assert sorted(p["name"] for p in peers) == sorted(set(sockets(mesh)) - {name})
        assert all(p["advert_age_s"] < 3 * ADVERT_INTERVAL_S for p in peers), peers
        assert all(p["models"] for p in peers)


def test_submit_on_any_node_returns_text(mesh: dict[str, Any]) -> None:
    for sock in sockets(mesh).values():
        out = json.loads(meshd("submit", "--json", "-n", "8", "--socket", sock, "Once upon a time").stdout)
        assert out["text"].strip(), out
        assert len(out["token_ids"]) == 8
        assert out["served_by"] in sockets(mesh)
        assert out["route"][-1] == out["served_by"]
        assert out["ttft_ms"] > 0 and out["request_id"]


def test_model_served_by_one_node_is_served_by_that_node(mesh: dict[str, Any]) -> None:
    for sock in list(sockets(mesh).values())[:3]:
        out = json.loads(meshd("submit", "--json", "-n", "4", "--model", SOLO_MODEL,
                               "--socket", sock, "The king said").stdout)
        assert out["served_by"] == "n5"


def test_unknown_model_fails_with_a_clear_error(mesh: dict[str, Any]) -> None:
    proc = meshd("submit", "--model", "no-such-model", "--socket", sockets(mesh)["n1"], "hi", check=False)
    assert proc.returncode == 69
    assert "no-such-model" in proc.stderr and "Traceback" not in proc.stderr


def _restart(mesh: dict[str, Any], name: str) -> None:
    node = next(n for n in mesh["nodes"] if n["name"] == name)
    node["pid"] = start_process(Path(node["dir"]))
    (Path(mesh["dir"]) / "testnet.json").write_text(json.dumps(mesh, indent=2))


def test_killed_daemon_leaves_every_table_and_comes_back(mesh: dict[str, Any]) -> None:
    victim = next(n for n in mesh["nodes"] if n["name"] == "n3")
    others = {k: v for k, v in sockets(mesh).items() if k != "n3"}
    os.kill(victim["pid"], signal.SIGKILL)
    wait_for(lambda: not alive(victim["pid"]), 10, "n3 to die")
    reap(victim["pid"])
    wait_for(lambda: all("n3" not in {p["name"] for p in peers_of(s)} for s in others.values()),
             3 * ADVERT_INTERVAL_S, "n3 to leave every peer table within 3 advert intervals")
    _restart(mesh, "n3")
    wait_for(lambda: all("n3" in {p["name"] for p in peers_of(s)} for s in others.values()),
             60, "n3 to come back")


def test_frozen_peer_is_routed_around_and_redialled(mesh: dict[str, Any]) -> None:
    victim = next(n for n in mesh["nodes"] if n["name"] == "n2")
    s1 = sockets(mesh)["n1"]
    os.kill(victim["pid"], signal.SIGSTOP)
    try:
        wait_for(lambda: "n2" not in {p["name"] for p in peers_of(s1)}, 20, "n1 to drop frozen n2")
        for _ in range(4):
            out = json.loads(meshd("submit", "--json", "-n", "4", "--socket", s1, "Hello").stdout)
            assert out["served_by"] != "n2"
    finally:
        os.kill(victim["pid"], signal.SIGCONT)
    wait_for(lambda: "n2" in {p["name"] for p in peers_of(s1)}, 60, "n2 to be redialled")


def test_status_reports_identity_and_services(mesh: dict[str, Any]) -> None:
    data = json.loads(meshd("status", "--json", "--socket", sockets(mesh)["n1"]).stdout)
    assert data["name"] == "n1" and data["peer_id"].startswith("12D3")
    assert data["models"][0]["num_layers"] > 0
    assert {"gossip", "attestation", "links", "request_server"} <= set(data["services"])
    sent = data["services"]["gossip"]["sent"]  # what pubsub wrote to peers, by kind
    assert sent["rpcs"] >= sent["messages"] > 0  # its own adverts went out to its peers


def test_unattested_daemon_cannot_join_or_be_served(mesh: dict[str, Any], tmp_path: Path) -> None:
    """A daemon with a certificate from another CA bootstraps to n1: nobody accepts it."""
    from meshd.testnet.launcher import free_port, issue_keys, node_config, write_toml

    spec = NodeSpec(name="intruder", port=free_port(), models=[])
    issue_keys(tmp_path, [spec])  # its own CA, not the mesh's
    first = mesh["nodes"][0]
    cfg = node_config(spec, tmp_path / "intruder", [first["addr"]], advert_interval_s=ADVERT_INTERVAL_S)
    (tmp_path / "intruder" / "meshd.toml").write_text(write_toml(cfg))
    pid = start_process(tmp_path / "intruder")
    try:
        sock = str(tmp_path / "intruder" / "meshd.sock")
        wait_for(lambda: Path(sock).exists(), 30, "the intruder's socket")
        s1 = sockets(mesh)["n1"]

        def rejected() -> bool:
            st = json.loads(meshd("status", "--json", "--socket", s1).stdout)
            return st["services"]["attestation"]["rejected_total"] > 0

        wait_for(rejected, 30, "n1 to reject the intruder's handshake")
        assert peers_of(sock) == []
        assert all("intruder" not in {p["name"] for p in peers_of(s)} for s in sockets(mesh).values())
        proc = meshd("submit", "--socket", sock, "hi", check=False)
        assert proc.returncode != 0 and "Traceback" not in proc.stderr
    finally:
        os.kill(pid, signal.SIGTERM)
        wait_for(lambda: not alive(pid), 15, "the intruder to stop")
        reap(pid)
