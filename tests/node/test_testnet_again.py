"""`meshd testnet up` works again in the same folder, and `down` stops every daemon of the folder
(issue 13, defect 8): up twice in a row, up after down (same CA and keys), up after `ca/` alone
was removed (all new keys), and down with daemons restarted by hand. Real daemons on the tiny
model; every wait has a deadline."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from meshd.testnet.children import alive
from meshd.testnet.drive import cli, peers_of, wait_for
from meshd.testnet.launcher import write_toml
from meshd.testnet.procs import config_arg, socket_owner

pytestmark = pytest.mark.slow


@pytest.fixture
def env(tmp_path: Path, tiny_model: Path) -> dict[str, str]:
    return {**os.environ, "MESHD_HOME": str(tmp_path / "home")}


def _up(d: Path, env: dict[str, str]) -> dict[str, Any]:
    proc = cli("testnet", "up", "--nodes", "2", "--dir", str(d), env=env, timeout=240)
    assert "is up" in proc.stdout, proc.stdout + proc.stderr
    index = json.loads((d / "testnet.json").read_text())
    for n in index["nodes"]:
        assert len(peers_of(n["socket"])) == 1
    return index


def _ids(index: dict[str, Any]) -> dict[str, str]:
    return {n["name"]: n["peer_id"] for n in index["nodes"]}


def _down(d: Path, env: dict[str, str], index: dict[str, Any]) -> None:
    cli("testnet", "down", "--dir", str(d), env=env, timeout=60)
    assert not any(alive(n["pid"]) for n in index["nodes"])


def test_up_again_in_the_same_folder(tmp_path: Path, env: dict[str, str]) -> None:
    d = tmp_path / "net"
    first = _up(d, env)
    again = _up(d, env)  # README command 1 run twice: the running mesh is replaced
    assert _ids(again) == _ids(first)  # the folder's CA and keys are kept
    assert not any(alive(n["pid"]) for n in first["nodes"])
    _down(d, env, again)
    after_down = _up(d, env)
    assert _ids(after_down) == _ids(first)
    _down(d, env, after_down)
    shutil.rmtree(d / "ca")  # only the CA removed: every identity is issued afresh
    new_ca = _up(d, env)
    assert set(_ids(new_ca).values()).isdisjoint(_ids(first).values())
    _down(d, env, new_ca)


def test_down_stops_daemons_restarted_by_hand(tmp_path: Path, env: dict[str, str]) -> None:
    d = tmp_path / "net"
    index = _up(d, env)
    n1, n2 = index["nodes"]
    hand: list[subprocess.Popen[bytes]] = []
    try:
        for n in index["nodes"]:
            os.kill(n["pid"], 15)
            wait_for(lambda n=n: not alive(n["pid"]), 20, f"{n['name']} to stop")
        # n2 again from its own folder, with a relative config path (found by its config)
        hand.append(subprocess.Popen([sys.executable, "-m", "meshd", "run", "--config", "meshd.toml"],
                                     cwd=n2["dir"], env=env, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL))
        # n1 again from a config outside the folder whose socket is n1's (found by its socket)
        cfg = _absolute_copy(Path(n1["dir"]))
        outside = tmp_path / "elsewhere" / "n1.toml"
        outside.parent.mkdir()
        outside.write_text(write_toml(cfg))
        hand.append(subprocess.Popen([sys.executable, "-m", "meshd", "run", "--config", str(outside)],
                                     env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        for proc, n in zip(hand, (n2, n1), strict=True):
            wait_for(lambda p=proc, n=n: socket_owner(Path(n["socket"])) == p.pid
                     or p.poll() is not None, 60, f"{n['name']} restarted by hand to serve")
            assert proc.poll() is None
        out = cli("testnet", "down", "--dir", str(d), env=env, timeout=60).stdout
        assert "stopped 2 daemons" in out, out
        for proc in hand:
            assert proc.wait(timeout=20) is not None
    finally:
        for proc in hand:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _absolute_copy(node_dir: Path) -> dict[str, Any]:
    import tomllib

    cfg = tomllib.loads((node_dir / "meshd.toml").read_text())
    cfg["keys"] = {k: str(node_dir / v) for k, v in cfg["keys"].items()}
    return cfg


def test_config_arg_of_a_command_line() -> None:
    assert config_arg(["python", "-m", "meshd", "run", "--config", "a.toml"]) == "a.toml"
    assert config_arg(["/usr/bin/meshd", "run", "-c", "/etc/meshd/meshd.toml"]) == "/etc/meshd/meshd.toml"
    assert config_arg(["meshd", "run", "--config=x.toml"]) == "x.toml"
    assert config_arg(["python", "-m", "meshd", "submit", "--config", "a.toml"]) is None
    assert config_arg(["vim", "run", "--config", "a.toml"]) is None
    assert config_arg(["python", "-m", "meshd", "run"]) is None
