"""proto/errors.md says what the code does: every ErrorCode has a row, and each row's HTTP status
and CLI exit code are the ones meshd.api.errors and meshd.cli.main give that code."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from meshd.api.errors import status_of
from meshd.cli.main import exit_code_for
from meshd.errors import ErrorCode, RemoteError

ROOT = Path(__file__).resolve().parents[2]
ROW = re.compile(r"^\| `([a-z_]+)` \|(.*)\|\s*$")


def documented() -> dict[str, tuple[str, str]]:
    """code -> (CLI exit cell, HTTP cell), from the table of proto/errors.md."""
    rows: dict[str, tuple[str, str]] = {}
    for line in (ROOT / "proto" / "errors.md").read_text().splitlines():
        m = ROW.match(line)
        if m is None:
            continue
        cells = [c.strip() for c in m.group(2).split("|")]
        assert len(cells) == 4, f"row {m.group(1)!r}: expected meaning, sent by, exit, HTTP: {line}"
        assert m.group(1) not in rows, f"{m.group(1)!r} has two rows"
        rows[m.group(1)] = (cells[2], cells[3])
    return rows


def test_every_code_has_a_row_and_every_row_a_code() -> None:
    rows = documented()
    assert sorted(rows) == sorted(c.value for c in ErrorCode)


def test_table_lists_codes_in_enum_order() -> None:
    assert list(documented()) == [c.value for c in ErrorCode]  # append-only, like the enum


@pytest.mark.parametrize("code", list(ErrorCode), ids=str)
def test_http_status_matches_the_api(code: ErrorCode) -> None:
    http = documented()[code.value][1]
    m = re.match(r"(\d{3})\b", http)
    assert m is not None, f"{code.value}: no status in {http!r}"
    assert int(m.group(1)) == status_of(code), (
        f"proto/errors.md says {code.value} is HTTP {m.group(1)}, meshd.api.errors says "
        f"{status_of(code)}")


@pytest.mark.parametrize("code", list(ErrorCode), ids=str)
def test_cli_exit_matches_the_cli(code: ErrorCode) -> None:
    cell = documented()[code.value][0]
    if cell == "-":  # never reaches the CLI (an HTTP API answer only)
        assert code == ErrorCode.UNAUTHORIZED
        return
    assert int(cell) == exit_code_for(RemoteError("x", code)), code.value


def test_the_check_would_catch_drift(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    page = (ROOT / "proto" / "errors.md").read_text()
    row = next(line for line in page.splitlines() if line.startswith("| `peer_gone` |"))
    drifted = row[: row.rstrip(" |").rfind("|")] + "| 599 |"
    (tmp_path / "proto").mkdir()
    (tmp_path / "proto" / "errors.md").write_text(page.replace(row, drifted))
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    with pytest.raises(AssertionError, match="peer_gone is HTTP 599"):
        test_http_status_matches_the_api(ErrorCode.PEER_GONE)
