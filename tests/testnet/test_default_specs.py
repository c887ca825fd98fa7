"""The nodes of `meshd testnet up` without a scenario serve their one model at a tier, so that
`meshd submit --model auto` finds one (issue 28)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from meshd.cli import main as cli_main
from meshd.config import parse_config
from meshd.exitcodes import Exit
from meshd.testnet.launcher import TESTNET_TIER, default_specs, node_config, write_toml


def test_testnet_nodes_serve_their_model_at_a_tier(tmp_path: Path) -> None:
    specs = default_specs(3, "/m/smol")
    assert [s.name for s in specs] == ["node1", "node2", "node3"]
    for s in specs:
        assert s.models == [{"path": "/m/smol", "tier": TESTNET_TIER, "quality": 1.0}]
    assert default_specs(1)[0].models[0]["path"] == "default"
    text = write_toml(node_config(specs[0], tmp_path / "node1", [], advert_interval_s=2.0))
    cfg = parse_config(tomllib.loads(text))
    assert [(m.path, m.tier) for m in cfg.models] == [("/m/smol", "large")]


def test_testnet_model_and_scenario_exclude_each_other(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli_main.main(["testnet", "up", "--model", "default", "--scenario", "x.toml"])
    assert code == Exit.FAILURE
    assert capsys.readouterr().err == ("meshd testnet: --model: a scenario names its nodes' "
                                       "models itself\n")
