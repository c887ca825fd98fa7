"""The written wire contract (proto/) and the code agree; golden vectors still decode."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from meshd.core.wire import MAX_STAGE_FRAME, FrameDecoder

ROOT = Path(__file__).resolve().parents[2]


def _gen() -> object:
    spec = importlib.util.spec_from_file_location("gen_proto", ROOT / "scripts" / "gen_proto.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_registry_toml_matches_code() -> None:
    assert (ROOT / "proto" / "registry.toml").read_text() == _gen().registry_toml()  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", sorted(_gen().GOLDEN))  # type: ignore[attr-defined]
def test_golden_vectors_decode(name: str) -> None:
    t, fields = _gen().GOLDEN[name]  # type: ignore[attr-defined]
    d = FrameDecoder(MAX_STAGE_FRAME)
    d.feed((ROOT / "proto" / "golden" / f"{name}.bin").read_bytes())
    (msg,) = list(d.messages())
    assert msg["t"] == int(t)
    assert {k: msg[k] for k in fields} == fields


def test_error_codes_agree_in_code_and_docs() -> None:
    from meshd.core.messages import ERROR_CODES
    from meshd.errors import ErrorCode

    assert [c.value for c in ErrorCode] == list(ERROR_CODES)  # same codes, same (append) order
    page = (ROOT / "proto" / "errors.md").read_text()
    for code in ERROR_CODES:
        assert f"| `{code}` |" in page, code


def test_every_field_names_a_version_that_exists() -> None:
    """A field's ``since`` is a protocol version, at most the current one; fields appended
    later name a later version (append-only: a version never gains fields once released)."""
    from meshd.core.messages import PROTOCOL_VERSION, SPECS

    for spec in SPECS:
        for f in spec.fields:
            assert 1 <= f.since <= PROTOCOL_VERSION, (spec.name, f.name, f.since)
    assert max(f.since for spec in SPECS for f in spec.fields) == PROTOCOL_VERSION
