"""Every [section] of the config file is a frozen dataclass that a file can set and
`meshd run --print-default-config` prints: a section class that lost its decorator (as one
did in a merge) passes the type checker but crashes every daemon at start-up."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from meshd.config import _SECTIONS, Config, load_config


@pytest.mark.parametrize("name", sorted(_SECTIONS))
def test_section_is_a_frozen_dataclass_with_defaults(name: str) -> None:
    cls = _SECTIONS[name]
    assert dataclasses.is_dataclass(cls), f"[{name}]: {cls.__name__} is not a dataclass"
    assert cls.__dataclass_params__.frozen, f"[{name}]: {cls.__name__} is not frozen"  # type: ignore[attr-defined]
    cls()  # every key has a default


def test_every_section_reads_from_a_file(tmp_path: Path) -> None:
    f = tmp_path / "meshd.toml"
    f.write_text("".join(f"[{name}]\n" for name in sorted(_SECTIONS) if name != "models"))
    cfg = load_config(f)
    assert isinstance(cfg, Config)
    for name in _SECTIONS:
        if name != "models":
            assert getattr(cfg, name) == _SECTIONS[name]()


@pytest.mark.parametrize(("text", "want"), [("", 256), ("[engine]\nprefix_cache_mb = 0\n", 0),
                                            ("[engine]\nprefix_cache_mb = 1024\n", 1024)])
def test_engine_prefix_cache_budget(tmp_path: Path, text: str, want: int) -> None:
    f = tmp_path / "meshd.toml"
    f.write_text(text)
    assert load_config(f).engine.prefix_cache_mb == want


@pytest.mark.parametrize(("text", "want"), [
    ("", True),  # on by default
    ("[engine]\nbatching = false\n", False),
    ("[engine]\nbatching = true\n", True),
])
def test_engine_batching_switch(tmp_path: Path, text: str, want: bool) -> None:
    f = tmp_path / "meshd.toml"
    f.write_text(text)
    assert load_config(f).engine.batching is want


@pytest.mark.parametrize(("text", "message"), [
    ('[engine]\nbatching = "no"\n', "[engine].batching must be true or false"),
    ("[engine]\nbatching = 0\n", "[engine].batching must be true or false"),
    ("[engine]\nworkers = 0\n", "[engine] workers must be >= 1"),
    ("[cache]\nmax_error = 1.0\n", "[cache] max_error must be in [0, 1)"),
    ("[cache]\nmax_error = -0.01\n", "[cache] max_error must be in [0, 1)"),
    ("[cache]\nthreshold = 0.9\n", "(known keys: embed_precision, enabled, max_entries, max_error,"),
    ("[engine]\nprefix_cache_mb = -1\n", "[engine] prefix_cache_mb must be >= 0"),
    ("[engine]\nprefix_cache = 64\n", "unknown key 'prefix_cache'"),
])
def test_engine_and_cache_keys_are_checked(tmp_path: Path, text: str, message: str) -> None:
    from meshd.errors import ConfigError

    f = tmp_path / "meshd.toml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=re.escape(message)) as err:
        load_config(f)
    assert "\n" not in str(err.value) and str(f) in str(err.value)


def test_cache_max_error_default(tmp_path: Path) -> None:
    f = tmp_path / "meshd.toml"
    f.write_text("[cache]\nmax_error = 0\n")
    assert load_config(f).cache.max_error == 0.0  # exact repeats only
    assert Config().cache.max_error == 0.01
