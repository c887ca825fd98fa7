"""`meshd model import | generate | inspect` through ``meshd.cli.main.main``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from meshd.cli.main import main
from meshd.exitcodes import Exit


def test_import_inspect_generate(hf_dirs: dict[str, Path], tmp_path: Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "tiny"
    rc = main(["model", "import", str(hf_dirs["qwen2"]), "--out", str(out), "--stages", "3",
               "--dtype", "fp16", "--name", "tiny-qwen"])
    assert rc == Exit.OK
    assert "imported tiny-qwen: qwen2, 4 layers" in capsys.readouterr().out

    assert main(["model", "inspect", str(out), "--json"]) == Exit.OK
    info = json.loads(capsys.readouterr().out)
    assert info["manifest"]["name"] == "tiny-qwen"
    assert info["manifest"]["dtype"] == "fp16"
    assert [s["layers"] for s in info["manifest"]["stages"]] == [[0, 2], [2, 3], [3, 4]]
    assert info["files"]["weights.bin"] == info["manifest"]["weights"]["bytes"]
    assert [m["layers"] for m in info["stage_memory"]][0] == [0, 4]

    assert main(["model", "inspect", str(out)]) == Exit.OK
    text = capsys.readouterr().out
    assert "tiny-qwen (version 1)" in text and "layers [2, 3) (prebuilt)" in text

    rc = main(["model", "generate", str(out), "Once upon a time", "--max-tokens", "5",
               "--temperature", "0", "--json"])
    assert rc == Exit.OK
    result = json.loads(capsys.readouterr().out)
    assert len(result["token_ids"]) == result["generated_tokens"] <= 5
    assert result["provider"] == "CPUExecutionProvider"
    assert {"text", "ttft_ms", "tokens_per_s", "finish_reason"} <= set(result)

    rc = main(["model", "generate", str(out), "Once upon a time", "--max-tokens", "3",
               "--seed", "1"])
    captured = capsys.readouterr()
    assert rc == Exit.OK
    assert "tokens/s, CPUExecutionProvider]" in captured.err


def test_generate_chat_prompt(hf_dirs: dict[str, Path], model_dirs: dict[str, Path],
                              capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["model", "generate", str(model_dirs["llama"]), "hi", "--chat", "--json",
               "--max-tokens", "2", "--temperature", "0"])
    assert rc == Exit.OK
    assert json.loads(capsys.readouterr().out)["prompt_tokens"] > 3


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        (["model", "inspect", "{tmp}/nothing"], Exit.FAILURE, "not a meshd model directory"),
        (["model", "import", "{tmp}/nothing", "--out", "{tmp}/x"], Exit.FAILURE,
         "no such directory"),
        (["model", "generate", "{model}", "hi", "--max-tokens", "0"], Exit.CONFIG,
         "max_tokens=0 must be an integer >= 1"),
        (["model", "generate", "{model}", "hi", "--chat"], Exit.FAILURE,
         "ships no chat template"),
    ],
)
def test_errors_are_one_line(argv: list[str], code: int, message: str, tmp_path: Path,
                             model_dirs: dict[str, Path],
                             capsys: pytest.CaptureFixture[str]) -> None:
    argv = [a.format(tmp=tmp_path, model=model_dirs["qwen2"]) for a in argv]
    assert main(argv) == code
    err = capsys.readouterr().err
    assert message in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_bare_model_command_prints_usage(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["model"]) == Exit.USAGE
    assert "import" in capsys.readouterr().out
