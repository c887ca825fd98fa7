"""Where network namespaces cannot be used, a scenario runs on loopback and says so."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from meshd.errors import LocalError
from meshd.testnet import netns
from meshd.testnet.scenario import parse_scenario
from meshd.testnet.scenario_up import up_scenario

TWO = """
advert_interval_s = 1.0
[regions.a]
rtt_ms = 4
[regions.b]
rtt_ms = 4
[[links]]
between = ["a", "b"]
rtt_ms = 40
[[nodes]]
name = "a1"
region = "a"
config = { engine = { threads = 1 } }
[[nodes]]
name = "b1"
region = "b"
max_decode_tokens_per_s = 50
config = { engine = { threads = 1 } }
"""


def test_namespaces_need_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert netns.unavailable_reason() == "network namespaces need root"


def test_namespaces_need_the_ip_tool(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr("shutil.which", lambda name: None)
    assert "`ip` tool" in (netns.unavailable_reason() or "")


def test_isolation_netns_is_an_error_where_unavailable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(netns, "unavailable_reason", lambda: "network namespaces need root")
    import tomllib

    with pytest.raises(LocalError, match="cannot isolate the nodes in network namespaces: .*need root"):
        up_scenario(tmp_path / "t", parse_scenario(tomllib.loads(TWO), "two.toml"), isolation="netns")
    assert not (tmp_path / "t" / "testnet.json").exists()


@pytest.mark.slow
def test_loopback_fallback_runs_and_says_there_is_no_emulation(tmp_path: Path) -> None:
    scenario = tmp_path / "two.toml"
    scenario.write_text(TWO)
    d = tmp_path / "net"
    env = {k: v for k, v in os.environ.items() if k != "MESHD_DEFAULT_MODEL"}

    def meshd(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "meshd", *args], capture_output=True, text=True,
                              timeout=120, env=env)

    up = meshd("testnet", "up", "--scenario", str(scenario), "--dir", str(d), "--isolation", "loopback")
    try:
        assert up.returncode == 0, up.stderr
        assert "LOOPBACK, NO LATENCY EMULATION" in up.stdout
        index = json.loads((d / "testnet.json").read_text())
        assert index["network"]["mode"] == "loopback"
        assert {n["host"] for n in index["nodes"]} == {"127.0.0.1"}
        assert netns.namespaces(netns.prefix_for(d)) == []
        sock = next(n["socket"] for n in index["nodes"] if n["name"] == "a1")
        out = meshd("submit", "--socket", sock, "--max-tokens", "4", "--json", "In the beginning")
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)["tokens"] >= 1
    finally:
        down = meshd("testnet", "down", "--dir", str(d))
    assert down.returncode == 0 and "removed the network" not in down.stdout
