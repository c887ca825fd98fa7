"""Run ``tegrastats`` on a Jetson and keep it running: its lines feed ``HostTelemetry``.

tegrastats prints one line per interval until it is killed. The supervisor keeps the latest
line in the telemetry source (``feed``), and when the process exits or cannot start it clears
the line (the figures only tegrastats has become unknown), reports the failure once through the
``FailureReport`` (source ``tegrastats``) and starts it again after a backoff (1 s, 2 s, 4 s ...
60 s; ``meshd.core.backoff``), reset once a run has lasted a minute. A line that arrives after a
failure logs the recovery.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import trio

from meshd.core.backoff import backoff_s
from meshd.telemetry.jetson import is_jetson
from meshd.telemetry.report import FailureReport
from meshd.telemetry.tegrastats import MAX_LINE

log = logging.getLogger(__name__)

SOURCE = "tegrastats"
STABLE_RUN_S = 60.0  # a run this long resets the backoff
TEST_COMMAND_ENV = "MESHD_TEST_TEGRASTATS"  # tests: a fake tegrastats executable


def tegrastats_command(root: Path, interval_ms: int) -> list[str] | None:
    """The tegrastats command line on a Jetson that has it (``None`` elsewhere)."""
    fake = os.environ.get(TEST_COMMAND_ENV)
    if fake:
        return [fake, "--interval", str(interval_ms)]
    exe = shutil.which("tegrastats") or ("/usr/bin/tegrastats" if Path("/usr/bin/tegrastats").is_file() else None)
    if exe is None or not is_jetson(root):
        return None
    return [exe, "--interval", str(interval_ms)]


class TegrastatsSupervisor:
    def __init__(self, command: Sequence[str], feed: Callable[[str | None], None],
                 report: FailureReport, *, base_s: float = 1.0, cap_s: float = 60.0) -> None:
        self.command = list(command)
        self.feed = feed
        self.report = report
        self.base_s, self.cap_s = base_s, cap_s
        self.starts = 0
        self.lines = 0

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        failures = 0
        while True:
            began = trio.current_time()
            error = await self.run_once()
            self.feed(None)
            if trio.current_time() - began >= STABLE_RUN_S:
                failures = 0
            failures += 1
            self.report.failed(SOURCE, error)
            await trio.sleep(backoff_s(failures, base_s=self.base_s, cap_s=self.cap_s))

    async def run_once(self) -> str:
        """Run tegrastats until it exits; returns why it stopped."""
        self.starts += 1
        try:
            proc = await trio.lowlevel.open_process(self.command, stdout=subprocess.PIPE,
                                                    stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
        except OSError as err:
            return f"cannot start {self.command[0]}: {err.strerror or err}"
        assert proc.stdout is not None
        try:
            buf = b""
            while chunk := await proc.stdout.receive_some(MAX_LINE):
                buf += chunk
                *done, buf = buf.split(b"\n")
                buf = buf[-MAX_LINE:]
                if done and done[-1].strip():
                    self.lines += 1
                    self.feed(done[-1].decode("utf-8", "replace"))
                    self.report.ok(SOURCE)
            code = await proc.wait()
            return f"tegrastats exited with status {code}"
        finally:
            if proc.returncode is None:
                proc.kill()
                with trio.CancelScope(shield=True):
                    await proc.wait()
            with trio.CancelScope(shield=True):
                await proc.stdout.aclose()

    def statistics(self) -> dict[str, int]:
        return {"starts": self.starts, "lines": self.lines}
