"""Scenario files: every shipped one loads; mistakes name the key and the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshd.errors import ConfigError
from meshd.sim.capacity import capacity
from meshd.sim.scenario_parse import load_scenario

from .helpers import SCENARIOS, scenario


@pytest.mark.parametrize("path", sorted(SCENARIOS.glob("*.toml")), ids=lambda p: p.name)
def test_shipped_scenarios_load(path: Path) -> None:
    sc = load_scenario(path)
    assert sc.node_count > 0
    assert capacity(sc).capacity_rps > 0


def test_mesh_512_is_what_the_issue_asks() -> None:
    sc = load_scenario(SCENARIOS / "mesh-512.toml")
    cap = capacity(sc)
    assert sc.node_count == 512
    assert len(sc.regions) == 4
    assert sc.run.duration_s == 300.0
    assert 0.70 <= cap.load <= 0.85  # high load, not overload
    assert 230_000 <= cap.offered_rps * sc.run.duration_s <= 250_000
    assert len(sc.hardware) >= 3  # heterogeneous


def _write(tmp_path: Path, text: str, name: str = "s.toml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_unknown_top_level_key_names_key_and_file(tmp_path: Path) -> None:
    base = (SCENARIOS / "tiny.toml").read_text()
    p = _write(tmp_path, "colour = 'blue'\n" + base)
    with pytest.raises(ConfigError, match=r"s\.toml.*'colour'"):
        load_scenario(p)


@pytest.mark.parametrize(
    ("tables", "key"),
    [
        ({"gossip": {"advert_intervl_s": 1.0}}, "gossip.advert_intervl_s"),
        ({"sim": {"durations": 3}}, "sim.durations"),
        ({"policy": {"alpha": 1.0}}, "policy.alpha"),
        ({"vivaldi": {"mode": "vivaldi", "rounds": 3}}, "vivaldi.rounds"),
    ],
)
def test_unknown_nested_key(tables: dict, key: str) -> None:
    with pytest.raises(ConfigError, match=rf"unit\.toml: unknown key '{key}'"):
        scenario(**tables)


def test_unknown_key_in_array_of_tables(tmp_path: Path) -> None:
    text = (
        (SCENARIOS / "tiny.toml")
        .read_text()
        .replace('name = "gpu"\n', 'name = "gpu"\nspeed = 3\n', 1)
    )
    with pytest.raises(ConfigError, match=r"unknown key 'hardware\[0\]\.speed'"):
        load_scenario(_write(tmp_path, text))


@pytest.mark.parametrize(
    ("tables", "match"),
    [
        ({"gossip": {"advert_interval_s": "2"}}, "gossip.advert_interval_s' must be a number"),
        ({"gossip": {"advert_loss": 1.5}}, "advert_loss' must be below 1"),
        ({"sim": {"max_attempts": 0}}, "sim.max_attempts' must be at least 1"),
        ({"vivaldi": {"mode": "gps"}}, "vivaldi.mode' must be 'vivaldi' or 'oracle'"),
        ({"latency": {"inter_region_ms": {"a/zz": 5.0}}}, "two different regions"),
        ({"latency": {"intra_region_ms": [9.0, 3.0]}}, "must be \\[low, high\\]"),
        ({"region": []}, "at least one \\[\\[region\\]\\]"),
        ({"arrivals": []}, "at least one \\[\\[arrivals\\]\\]"),
        ({"events": [{"at_s": 1.0, "action": "explode"}]}, "action' must be one of fail, join"),
        ({"events": [{"at_s": 1.0, "action": "join", "region": "a"}]}, "a join needs"),
        ({"events": [{"at_s": 1.0, "action": "fail"}]}, "a fail needs count or fraction"),
    ],
)
def test_bad_values(tables: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        scenario(**tables)


def test_bad_references() -> None:
    region = [{"name": "a", "nodes": [{"hardware": "tpu", "count": 1, "serve": ["m"]}]}]
    with pytest.raises(ConfigError, match="unknown hardware class 'tpu'"):
        scenario(region=region)
    region = [{"name": "a", "nodes": [{"hardware": "gpu", "count": 1, "serve": ["m:0-99"]}]}]
    with pytest.raises(ConfigError, match="bad layer range 'm:0-99'"):
        scenario(region=region)


def test_layer_ranges_parse() -> None:
    region = [
        {"name": "a", "nodes": [{"hardware": "gpu", "count": 2, "serve": ["m:0-4", "m:4-8"]}]}
    ]
    fixed = {
        "prompt_tokens": {"dist": "fixed", "mean": 10},
        "output_tokens": {"dist": "fixed", "mean": 5},
    }
    arrivals = [{"region": "a", "model": "m", "rate_per_s": 1.0, **fixed}]
    sc = scenario(region=region, latency={"inter_region_ms": {}}, arrivals=arrivals)
    serve = sc.regions[0].groups[0].serve
    assert [(s.layer_start, s.layer_end) for s in serve] == [(0, 4), (4, 8)]


def test_base_file_and_overrides(tmp_path: Path) -> None:
    p = _write(tmp_path, f'base = "{SCENARIOS / "tiny.toml"}"\n[gossip]\nadvert_interval_s = 0.5\n')
    sc = load_scenario(p)
    assert sc.gossip.advert_interval_s == 0.5
    assert sc.gossip.cell_size == 16  # inherited
    assert sc.node_count == 24
    o = sc.with_overrides(duration_s=5.0, seed=9, advert_interval_s=10.0, fail_fraction=0.1)
    assert (o.run.duration_s, o.run.seed, o.gossip.advert_interval_s) == (5.0, 9, 10.0)
    assert o.events[-1].action == "fail" and o.events[-1].fraction == 0.1
    assert o.events[-1].at_s == 2.5


def test_not_toml_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_scenario(_write(tmp_path, "[sim\n"))
    with pytest.raises(ConfigError, match="no such scenario file"):
        load_scenario(tmp_path / "nope.toml")
