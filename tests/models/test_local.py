"""The models folder: `meshd model list`, and what a `--model` argument means (issue 28)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from meshd.cli import main as cli_main
from meshd.engine import default_model_path
from meshd.errors import LocalError, ModelError
from meshd.exitcodes import Exit
from meshd.models.local import choose_model, list_models
from meshd.paths import models_home


def folder(tmp_path: Path) -> Path:
    """A models folder with the shipped model, an embedding manifest, a broken manifest, a
    pull in progress (hidden) and a directory that is no model."""
    models = tmp_path / "models"
    shutil.copytree(default_model_path(), models / "tiny")
    (models / "minilm").mkdir()
    (models / "minilm" / "manifest.json").write_text(json.dumps(
        {"format": "meshd-embedding", "name": "all-minilm", "dtype": "fp32"}))
    (models / "broken").mkdir()
    (models / "broken" / "manifest.json").write_text("{not json")
    (models / ".x.pulling-1" / "model").mkdir(parents=True)
    (models / ".x.pulling-1" / "model" / "manifest.json").write_text("{}")
    (models / "notes").mkdir()
    return models


def test_list_reads_each_manifest(tmp_path: Path) -> None:
    models = folder(tmp_path)
    got = {m.path.name: m for m in list_models(models)}
    assert set(got) == {"tiny", "minilm", "broken"}
    tiny = got["tiny"]
    assert (tiny.name, tiny.kind, tiny.arch, tiny.format, tiny.tier, tiny.catalog) == (
        "tiny-en", "generation", "llama", "fp16", "", "")
    assert tiny.size_bytes == sum(p.stat().st_size for p in default_model_path().iterdir())
    assert (got["minilm"].name, got["minilm"].kind, got["minilm"].arch) == ("all-minilm", "embedding", "bert")
    assert got["broken"].problem.startswith("manifest.json: ") and got["broken"].kind == ""
    assert list_models(tmp_path / "nowhere") == []


def test_list_from_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    models = folder(tmp_path)
    assert cli_main.main(["model", "list", "--models-dir", str(models)]) == Exit.OK
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"models in {models}:"
    assert lines[1].split() == ["NAME", "ARCH", "FORMAT", "SIZE", "TIER", "CATALOG"]
    tiny = next(ln for ln in lines if ln.startswith("tiny-en"))
    mib = sum(p.stat().st_size for p in default_model_path().iterdir()) / 2**20
    assert tiny.split() == ["tiny-en", "llama", "fp16", f"{mib:.1f}", "MiB", "-", "-"]
    assert "unusable: manifest.json:" in next(ln for ln in lines if ln.startswith("broken"))
    assert cli_main.main(["model", "list", "--json", "--models-dir", str(models)]) == Exit.OK
    data = json.loads(capsys.readouterr().out)
    assert data["models_dir"] == str(models)
    assert [m["name"] for m in data["models"]] == ["all-minilm", "broken", "tiny-en"]
    assert cli_main.main(["model", "list", "--models-dir", str(tmp_path / "empty")]) == Exit.OK
    assert capsys.readouterr().out.startswith(f"no models in {tmp_path / 'empty'} (meshd model pull")


def test_the_models_folder_follows_the_environment(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MESHD_MODELS_DIR", raising=False)
    monkeypatch.setenv("MESHD_HOME", str(tmp_path / "home"))
    assert models_home() == tmp_path / "home" / "models"
    monkeypatch.setenv("MESHD_MODELS_DIR", str(tmp_path / "m"))
    assert models_home() == tmp_path / "m"


def test_what_a_model_argument_means(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    models = folder(tmp_path)
    assert choose_model("default", models).path == "default"
    assert choose_model(str(models / "tiny"), models).path == str((models / "tiny").resolve())
    assert choose_model("tiny", models).path == str((models / "tiny").resolve())
    pulled = choose_model("smollm2-135m-instruct", models)
    assert pulled.pull is not None and pulled.pull.name == "smollm2-135m-instruct"
    assert pulled.path == str((models / "smollm2-135m-instruct").resolve())
    shutil.copytree(default_model_path(), models / "smollm2-135m-instruct")
    assert choose_model("smollm2-135m-instruct", models).pull is None  # already there
    with pytest.raises(ModelError, match="not a meshd model directory"):
        choose_model(str(models / "notes"), models)
    with pytest.raises(LocalError) as err:
        choose_model("llama-70b", models)
    assert str(err.value) == (
        f"model 'llama-70b': no such model directory, no model of that name in {models}, and not "
        "in meshd's catalog (smollm2-135m-instruct, gemma3-270m); `default` is the model "
        "shipped with meshd")
