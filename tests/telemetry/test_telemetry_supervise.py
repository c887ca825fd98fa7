"""tegrastats supervision: lines reach the source, a process that dies is restarted with backoff
and reported once, and the backoff formula itself."""

from __future__ import annotations

import logging
import stat
import sys

import pytest
import trio

from meshd.core.backoff import backoff_s
from meshd.telemetry.report import FailureReport
from meshd.telemetry.supervise import TegrastatsSupervisor, tegrastats_command
from meshd.testing.wait import wait_until

LINE = ("RAM 2448/3964MB (lfb 1x2MB) SWAP 0/1982MB (cached 0MB) CPU [11%@102,9%@102,off,off] "
        "EMC_FREQ 0% GR3D_FREQ 37% PLL@28.5C CPU@30.5C GPU@29.5C POM_5V_IN 4210/4000")


@pytest.mark.parametrize(("failures", "expected"), [(0, 0.0), (1, 1.0), (2, 2.0), (3, 4.0),
                                                    (7, 60.0), (500, 60.0)])
def test_backoff(failures, expected):
    assert backoff_s(failures, base_s=1.0, cap_s=60.0) == expected


def run_until(sup: TegrastatsSupervisor, starts: int, timeout_s: float) -> None:
    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sup.run)
            await wait_until(lambda: sup.starts >= starts, timeout_s=timeout_s)
            nursery.cancel_scope.cancel()

    trio.run(main)


def fake_tegrastats(tmp_path, lines: int):
    """An executable that prints ``lines`` tegrastats lines and exits with status 3."""
    exe = tmp_path / "tegrastats"
    exe.write_text(f"#!{sys.executable}\nimport sys\n"
                   f"for _ in range({lines}):\n    print({LINE!r}, flush=True)\nsys.exit(3)\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe


def test_a_dying_tegrastats_is_restarted_and_reported_once(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    exe = fake_tegrastats(tmp_path, lines=2)
    fed: list[str | None] = []
    report = FailureReport()
    sup = TegrastatsSupervisor([str(exe), "--interval", "1000"], fed.append, report,
                               base_s=0.01, cap_s=0.05)
    run_until(sup, 4, 30)
    assert LINE in fed and None in fed  # lines fed, and cleared when the process died
    assert sup.lines >= 3  # a chunk of lines counts once: only the latest line is kept
    failed = [r.getMessage() for r in caplog.records if "hardware reading failed" in r.getMessage()]
    recovered = [r.getMessage() for r in caplog.records if "reading recovered" in r.getMessage()]
    # each death after a good line is a new failure; what matters is one line per failure streak
    assert len(failed) == len(recovered) or len(failed) == len(recovered) + 1
    assert "tegrastats exited with status 3" in failed[0]


def test_a_tegrastats_that_cannot_start_is_reported_once(tmp_path, caplog):
    fed: list[str | None] = []
    report = FailureReport()
    sup = TegrastatsSupervisor([str(tmp_path / "missing")], fed.append, report,
                               base_s=0.001, cap_s=0.002)
    run_until(sup, 5, 10)
    failed = [r.getMessage() for r in caplog.records if "hardware reading failed" in r.getMessage()]
    assert len(failed) == 1 and "cannot start" in failed[0]
    assert report.failing == ("tegrastats",)
    assert fed and all(x is None for x in fed)


def test_command_only_on_a_jetson_or_when_a_test_names_one(tmp_path, monkeypatch):
    monkeypatch.delenv("MESHD_TEST_TEGRASTATS", raising=False)
    monkeypatch.setattr("shutil.which", lambda name: "/usr/bin/tegrastats")
    assert tegrastats_command(tmp_path, 2000) is None  # tegrastats on PATH, but not a Jetson
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/nv_tegra_release").write_text("# R32 (release), REVISION: 7.1\n")
    assert tegrastats_command(tmp_path, 2000) == ["/usr/bin/tegrastats", "--interval", "2000"]
    monkeypatch.setenv("MESHD_TEST_TEGRASTATS", "/x/fake")
    assert tegrastats_command(tmp_path, 500) == ["/x/fake", "--interval", "500"]
