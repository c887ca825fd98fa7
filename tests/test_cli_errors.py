"""The CLI ends every failure with one line and an exit code, never a traceback (issue 13,
defect 7; issue 12): meshd errors raised deep inside the daemon's nurseries (so wrapped in
exception groups) keep their own exit code, and anything else is a bug: one line, exit 70."""

from __future__ import annotations

import argparse
from typing import Any

import pytest
import trio

from meshd.cli import main as cli_main
from meshd.errors import ConfigError, KeyFileError, ModelError
from meshd.exitcodes import Exit


def _run_with(monkeypatch: pytest.MonkeyPatch, func: Any) -> None:
    """Make `meshd status` run ``func`` instead."""
    import meshd.cli.status

    monkeypatch.setattr(meshd.cli.status, "run", func)


def _nursery_failure(exc: BaseException) -> Any:
    """A command that fails like the daemon does: ``exc`` raised in a task of nested nurseries
    while a sibling task is cancelled."""
    async def fail() -> None:
        await trio.sleep(0)
        raise exc

    async def body() -> None:
        async with trio.open_nursery() as outer:
            outer.start_soon(trio.sleep_forever)
            async with trio.open_nursery() as inner:
                inner.start_soon(fail)

    return lambda args: trio.run(body)


@pytest.mark.parametrize(("exc", "code"), [
    (ConfigError("[node] listen[0]: port 4001 is already in use"), Exit.CONFIG),
    (KeyFileError("node.key is readable by others"), Exit.NOPERM),
    (ModelError("weights.bin: hash mismatch"), Exit.FAILURE),
])
def test_meshd_error_inside_nurseries_keeps_its_exit_code(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        exc: BaseException, code: int) -> None:
    _run_with(monkeypatch, _nursery_failure(exc))
    assert cli_main.main(["status"]) == code
    err = capsys.readouterr().err
    assert err == f"meshd status: {exc}\n"


def test_a_bug_is_one_line_and_exit_70(monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    def broken(args: argparse.Namespace) -> int:
        return {}["missing"]  # type: ignore[no-any-return]

    _run_with(monkeypatch, broken)
    assert cli_main.main(["status"]) == Exit.SOFTWARE
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert err.startswith("meshd status: internal error: KeyError")


def test_a_bug_inside_nurseries_is_one_line_and_exit_70(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    _run_with(monkeypatch, _nursery_failure(RuntimeError("boom\nsecond line")))
    assert cli_main.main(["status"]) == Exit.SOFTWARE
    err = capsys.readouterr().err
    assert err.splitlines() == [
        "meshd status: internal error: RuntimeError: boom (a bug in meshd; run again with -vv "
        "for the traceback and please report it)"]


def test_interrupt_inside_nurseries_exits_130(monkeypatch: pytest.MonkeyPatch) -> None:
    _run_with(monkeypatch, _nursery_failure(KeyboardInterrupt()))
    assert cli_main.main(["status"]) == Exit.INTERRUPTED


def test_a_refusal_names_its_wire_code(monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    from meshd.errors import ContextLengthError

    exc = ContextLengthError("the prompt is 300 tokens and the model's context is 256: no room "
                             "to generate", prompt_tokens=300, max_tokens=4, context=256)
    _run_with(monkeypatch, _nursery_failure(exc))
    assert cli_main.main(["status"]) == Exit.UNAVAILABLE
    assert capsys.readouterr().err == f"meshd status: {exc} (context_length_exceeded)\n"
