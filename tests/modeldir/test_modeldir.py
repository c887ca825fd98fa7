"""The model-folder base every kind of model stands on (meshd.modeldir): building a folder in a
staging sibling, the manifest's tensor list and layout, the architecture checks."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from meshd.errors import ModelError
from meshd.modeldir.arch import arch_from_json, check_positive_ints
from meshd.modeldir.importing import staging
from meshd.modeldir.manifest import (
    MANIFEST,
    TensorEntry,
    check_file_names,
    check_tensors,
    dumps_manifest,
    manifest_format,
    parse_tensors,
    write_manifest,
)


def test_a_failed_build_leaves_nothing(tmp_path: Path) -> None:
    out = tmp_path / "m"
    with pytest.raises(RuntimeError), staging(out, force=False) as tmp:
        (tmp / "weights.bin").write_bytes(b"x")
        raise RuntimeError("the import failed")
    assert list(tmp_path.iterdir()) == []


def test_a_finished_build_is_renamed_into_place(tmp_path: Path) -> None:
    out = tmp_path / "m"
    with staging(out, force=False) as tmp:
        assert tmp.parent == tmp_path and tmp.name.startswith(".m.importing-")
        (tmp / MANIFEST).write_text("{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]
    assert (out / MANIFEST).read_text() == "{}"


def test_force_replaces_and_a_racing_install_is_kept(tmp_path: Path) -> None:
    out = tmp_path / "m"
    out.mkdir()
    (out / MANIFEST).write_text('{"old": 1}')
    with staging(out, force=True) as tmp:
        (tmp / MANIFEST).write_text('{"new": 1}')
    assert json.loads((out / MANIFEST).read_text()) == {"new": 1}
    # another process installed the same folder while this one built it: its copy stays
    with staging(out, force=False) as tmp:
        (tmp / MANIFEST).write_text('{"mine": 1}')
    assert json.loads((out / MANIFEST).read_text()) == {"new": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


ROWS = [{"name": "a", "dtype": "fp32", "shape": [2, 2], "offset": 0, "nbytes": 16, "sha256": "0"},
        {"name": "b", "dtype": "fp16", "shape": [4], "offset": 64, "nbytes": 8, "sha256": "1"}]


def test_tensors_round_trip_and_are_checked() -> None:
    tensors = parse_tensors(ROWS)
    assert tensors[1] == TensorEntry("b", "fp16", (4,), 64, 8, "1")
    assert [t.to_json() for t in tensors] == ROWS
    check_tensors("m.json", tensors, ("fp32", "fp16"), "weights.bin", 72)
    with pytest.raises(ModelError, match="tensor 'b' lies outside weights.bin"):
        check_tensors("m.json", tensors, ("fp32", "fp16"), "weights.bin", 71)
    with pytest.raises(ModelError, match="tensor 'b' has unsupported dtype 'fp16'"):
        check_tensors("m.json", tensors, ("fp32",), "weights.bin", 72)
    with pytest.raises(KeyError):
        parse_tensors([{"name": "a"}])


@pytest.mark.parametrize("name", ["../w.bin", "a/b", "a\\b", ".hidden"])
def test_file_names_stay_in_the_folder(name: str) -> None:
    check_file_names("m.json", ["weights.bin", "encoder.onnx"])
    with pytest.raises(ModelError, match="must be a plain name"):
        check_file_names("m.json", ["weights.bin", name])


def test_the_manifest_has_one_line_per_tensor_and_stage(tmp_path: Path) -> None:
    data: dict[str, Any] = {"format": "meshd-model", "weights": {"file": "weights.bin",
                                                                 "tensors": ROWS},
                            "stages": [{"layers": [0, 2], "file": "layers-0-2.onnx"}]}
    text = dumps_manifest(data)
    assert json.loads(text) == data
    lines = text.splitlines()
    assert sum(1 for line in lines if '"sha256": ' in line and '"name"' in line) == 2
    assert any(line.strip().startswith('{"layers": [0, 2]') for line in lines)
    write_manifest(tmp_path, data)
    assert (tmp_path / MANIFEST).read_text() == text
    assert [p.name for p in tmp_path.iterdir()] == [MANIFEST]  # no partial file left
    assert manifest_format(tmp_path) == "meshd-model"
    assert manifest_format(tmp_path / "none") is None
    # an embedding manifest has no stages
    embed = {"format": "meshd-embedding", "weights": {"tensors": ROWS}}
    assert json.loads(dumps_manifest(embed)) == embed


@dataclass(frozen=True)
class _Arch:
    num_layers: int
    hidden_size: int

    def validate(self, source: str, names: dict[str, str] | None = None) -> None:
        check_positive_ints(self, ("num_layers", "hidden_size"), source, names or {})


def test_architecture_checks_name_the_field_as_the_source_spells_it() -> None:
    assert arch_from_json(_Arch, {"num_layers": 2, "hidden_size": 8}, "m.json") == _Arch(2, 8)
    with pytest.raises(ModelError, match=r"m.json: bad 'architecture' block"):
        arch_from_json(_Arch, {"num_layers": 2}, "m.json")
    with pytest.raises(ModelError, match=r"m.json: hidden_size=True must be a positive integer"):
        arch_from_json(_Arch, {"num_layers": 2, "hidden_size": True}, "m.json")
    with pytest.raises(ModelError, match=r"config.json: num_hidden_layers=0 must be"):
        check_positive_ints(_Arch(0, 8), ("num_layers",), "config.json",
                            {"num_layers": "num_hidden_layers"})
