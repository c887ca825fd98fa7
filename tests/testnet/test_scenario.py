"""Scenario files: every key is read, every mistake names the key and the file."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest

from meshd.config import parse_config
from meshd.errors import ConfigError
from meshd.testnet.scenario import LinkSpec, load_scenario, parse_scenario

REPO = Path(__file__).resolve().parents[2]

BASE = """
name = "t"
advert_interval_s = 1.5
seed = 7
[regions.eu]
rtt_ms = 10
jitter_ms = 1
[regions.us]
rtt_ms = 16
loss_pct = 0.5
[[links]]
between = ["us", "eu"]
rtt_ms = 90
jitter_ms = 3
[[nodes]]
name = "eu-1"
region = "eu"
labels = { residency = "eu" }
max_decode_tokens_per_s = 12.5
config = { engine = { threads = 1 }, routing = { hedge = false } }
[[nodes]]
name = "us-1"
region = "us"
models = [{ path = "default", layers = [0, 3], max_decode_tokens_per_s = 40 }, { path = "default", name = "b" }]
"""


def parse(text: str, src: str = "s.toml") -> Any:
    return parse_scenario(tomllib.loads(text), src)


def test_a_full_scenario_is_read() -> None:
    s = parse(BASE)
    assert (s.name, s.advert_interval_s, s.seed) == ("t", 1.5, 7)
    assert [r.name for r in s.regions] == ["eu", "us"]
    assert s.region("us").inside == LinkSpec(16.0, 0.0, 0.5)
    assert s.link("eu-1", "us-1") == s.link("us-1", "eu-1") == LinkSpec(90.0, 3.0, 0.0)
    assert s.region_link("eu", "eu") == LinkSpec(10.0, 1.0, 0.0)
    eu = s.node("eu-1")
    assert dict(eu.labels) == {"residency": "eu"}
    # the node's speed goes to every model that sets none; a model's own cap wins
    assert eu.daemon_models() == [{"path": "default", "max_decode_tokens_per_s": 12.5}]
    us = s.node("us-1")
    assert us.daemon_models()[0] == {"path": "default", "layers": [0, 3], "max_decode_tokens_per_s": 40}
    assert "max_decode_tokens_per_s" not in us.daemon_models()[1]
    assert eu.daemon_config() == {"engine": {"threads": 1}, "routing": {"hedge": False}}
    cfg = parse_config({**eu.daemon_config(), "models": eu.daemon_models()})
    assert cfg.models[0].max_decode_tokens_per_s == 12.5 and cfg.engine.threads == 1


def test_methods_return_copies() -> None:
    s = parse(BASE)
    s.node("eu-1").daemon_config()["engine"]["threads"] = 9
    s.node("eu-1").daemon_models()[0]["path"] = "x"
    assert s.node("eu-1").daemon_config()["engine"]["threads"] == 1
    assert s.node("eu-1").daemon_models()[0]["path"] == "default"


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ('seed = 7', 'seed = 7\nspeed = 3', "unknown key 'speed' in the top level of s.toml"),
        ('jitter_ms = 1\n', 'jitter_ms = 1\nlatency = 2\n', "unknown key 'latency' in [regions.eu] of s.toml"),
        ('rtt_ms = 90', 'rtt_ms = 90\nrtt = 1', "unknown key 'rtt' in [[links]][0] of s.toml"),
        ('region = "eu"', 'region = "eu"\nspeed = 4', "unknown key 'speed' in [[nodes]][0] of s.toml"),
        ('max_decode_tokens_per_s = 40 }', 'max_decode_tokens_per_s = 40, gpu = 1 }',
         "unknown key 'gpu' in node 'us-1'.models[0] of s.toml"),
        ('threads = 1 }', 'threads = 1, turbo = true }', "unknown key 'turbo' in s.toml node 'eu-1' [engine]"),
        ('hedge = false }', 'hedge = false }, gossipz = {}', "unknown section 'gossipz' in s.toml node 'eu-1'"),
        ('region = "eu"', 'region = "asia"', "s.toml: node 'eu-1'.region 'asia' is not a region"),
        ('between = ["us", "eu"]', 'between = ["us", "us"]', "[[links]][0].between must name two different"),
        ('[[links]]\nbetween = ["us", "eu"]\nrtt_ms = 90\njitter_ms = 3\n', '',
         "no [[links]] entry between regions eu and us"),
        ('rtt_ms = 16', 'rtt_ms = -1', "[regions.us].rtt_ms must be >= 0"),
        ('rtt_ms = 16', 'rtt_ms = "fast"', "[regions.us].rtt_ms must be a number"),
        ('loss_pct = 0.5', 'loss_pct = 100', "[regions.us].loss_pct must be in [0, 100)"),
        ('jitter_ms = 3', 'jitter_ms = 300', "[[links]][0].jitter_ms (300) must not exceed rtt_ms (90)"),
        ('max_decode_tokens_per_s = 12.5', 'max_decode_tokens_per_s = -2',
         "node 'eu-1'.max_decode_tokens_per_s must be >= 0"),
        ('layers = [0, 3]', 'layers = [3, 1]', "layers must be [start, end] with 0 <= start < end"),
        ('name = "us-1"', 'name = "eu-1"', "node name 'eu-1' is used twice"),
        ('name = "us-1"', 'name = "us 1"', "[[nodes]][1].name must be a name"),
        ('advert_interval_s = 1.5', 'advert_interval_s = 0', "advert_interval_s must be > 0"),
        ('labels = { residency = "eu" }', 'labels = { region = "us" }', "labels.region is set from"),
    ],
)
def test_mistakes_name_the_key_and_the_file(old: str, new: str, message: str) -> None:
    assert old in BASE
    with pytest.raises(ConfigError) as e:
        parse(BASE.replace(old, new, 1))
    assert message in str(e.value)


def test_nodes_and_regions_are_required() -> None:
    with pytest.raises(ConfigError, match=r"\[regions\] must name at least one region"):
        parse("[[nodes]]\nname='a'\nregion='x'\n")
    with pytest.raises(ConfigError, match=r"\[\[nodes\]\] must list at least one node"):
        parse("[regions.x]\nrtt_ms = 1\n")
    with pytest.raises(ConfigError, match=r"\[regions.x\] needs rtt_ms"):
        parse("[regions.x]\njitter_ms = 1\n[[nodes]]\nname='a'\nregion='x'\n")


def test_load_scenario_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read scenario file"):
        load_scenario(tmp_path / "none.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[regions\n")
    with pytest.raises(ConfigError, match=r"bad.toml: not valid TOML"):
        load_scenario(bad)


def test_the_shipped_regions_12_meets_the_acceptance_shape() -> None:
    s = load_scenario(REPO / "testnet" / "regions-12.toml")
    assert len(s.nodes) == 12 and len(s.regions) == 3
    assert all(len([n for n in s.nodes if n.region == r.name]) >= 3 for r in s.regions)
    assert all(5 <= r.inside.rtt_ms <= 20 for r in s.regions)
    assert len(s.links) == 3 and all(60 <= spec.rtt_ms <= 150 for _, _, spec in s.links)
    speeds = {n.max_decode_tokens_per_s for n in s.nodes}
    assert len(speeds) >= 3 and 0 not in speeds  # different, and every node capped
