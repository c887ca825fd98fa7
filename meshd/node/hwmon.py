"""The hardware monitor: re-reads this host's hardware every advert interval, off the event loop.

Each reading runs ``TelemetrySource.read`` on a worker thread (one at a time: a
``CapacityLimiter`` of one) under a deadline, so a hung NVML call or a slow sysfs file never
stalls the node: the reading is abandoned, reported once, and tried again next interval while
adverts keep the last good reading. Each good reading goes to ``on_reading`` (membership puts
it in the next advert, ``meshd status`` shows it). On a Jetson with tegrastats the monitor also
supervises a tegrastats process (``meshd.telemetry.supervise``). docs/telemetry.md.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from meshd.telemetry import Hardware, HostTelemetry, TelemetrySource
from meshd.telemetry.report import FailureReport
from meshd.telemetry.supervise import TegrastatsSupervisor, tegrastats_command

log = logging.getLogger(__name__)

READ_SOURCE = "reading"  # the FailureReport name of a reading that raised or ran past its deadline
MAX_DEADLINE_S = 5.0
GPU_PROVIDERS = ("CUDAExecutionProvider", "TensorrtExecutionProvider")
# Test hooks: point the daemon at a fake /proc and /sys tree, and at a fake NVML state file.
ROOT_ENV = "MESHD_TEST_TELEMETRY_ROOT"
NVML_ENV = "MESHD_TEST_FAKE_NVML"


def read_deadline_s(interval_s: float) -> float:
    """A reading's deadline: half the advert interval, at most 5 s."""
    return max(0.05, min(MAX_DEADLINE_S, interval_s / 2))


def host_source(report: FailureReport) -> tuple[HostTelemetry, Path]:
    """This host's telemetry source (or the fake tree and NVML the test hooks name)."""
    root = Path(os.environ.get(ROOT_ENV) or "/")
    nvml: Any = None
    if os.environ.get(NVML_ENV):
        from meshd.testing.fakes_telemetry import FileNvml

        nvml = FileNvml(os.environ[NVML_ENV])
    return HostTelemetry(root=root, nvml=nvml, report=report), root


def kv_memory_of(providers: list[str]) -> str:
    """Where the node's models keep their KV cache: ``"gpu"`` when any model runs on a GPU
    execution provider, else ``"host"`` (a Jetson's GPU memory is the host's anyway)."""
    return "gpu" if any(p in GPU_PROVIDERS for p in providers) else "host"


class HardwareMonitor:
    def __init__(
        self,
        source: TelemetrySource,
        *,
        interval_s: float,
        report: FailureReport,
        on_reading: Callable[[Hardware], None],
        kv_memory: str = "",
        tegrastats: TegrastatsSupervisor | None = None,
    ) -> None:
        self.source = source
        self.interval_s = interval_s
        self.deadline_s = read_deadline_s(interval_s)
        self.report = report
        self.on_reading = on_reading
        self.kv_memory = kv_memory
        self.tegrastats = tegrastats
        self.limiter = trio.CapacityLimiter(1)
        self.first: Hardware | None = None  # the reading taken at start-up, before the loop
        self.readings = 0
        self.failed_readings = 0

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            if self.tegrastats is not None:
                await nursery.start(self.tegrastats.run)
            task_status.started()
            while True:
                await trio.sleep(self.interval_s)
                await self.read_once()

    async def read_once(self) -> Hardware | None:
        """One reading on a worker thread under the deadline; ``None`` when it failed."""
        hw: Hardware | None = None
        try:
            with trio.move_on_after(self.deadline_s):
                # the installed trio-stubs predate abandon_on_cancel (trio >= 0.23 has it)
                hw = await trio.to_thread.run_sync(self._read, limiter=self.limiter,
                                                   abandon_on_cancel=True)  # type: ignore[call-arg]
            if hw is None:
                raise TimeoutError(f"no reading within {self.deadline_s:g} s")
        except Exception as err:  # a source must not raise; a broken one must not stop the node
            self.failed_readings += 1
            self.report.failed(READ_SOURCE, str(err) or repr(err))
            return None
        self.report.ok(READ_SOURCE)
        self.readings += 1
        if self.kv_memory:
            hw = dataclasses.replace(hw, kv_memory=self.kv_memory)
        self.on_reading(hw)
        return hw

    def _read(self) -> Hardware:
        return self.source.read()

    def statistics(self) -> dict[str, Any]:
        out: dict[str, Any] = {"readings": self.readings, "failed_readings": self.failed_readings,
                               "deadline_s": self.deadline_s, **self.report.statistics()}
        if self.tegrastats is not None:
            out["tegrastats"] = self.tegrastats.statistics()
        return out


def build_monitor(report: FailureReport, source: HostTelemetry, root: Path, *, interval_s: float,
                  on_reading: Callable[[Hardware], None], kv_memory: str) -> HardwareMonitor:
    """The daemon's monitor: the host source, and tegrastats where the host has it."""
    command = tegrastats_command(root, max(100, int(interval_s * 1000)))
    sup = TegrastatsSupervisor(command, source.feed_tegrastats, report) if command else None
    return HardwareMonitor(source, interval_s=interval_s, report=report, on_reading=on_reading,
                           kv_memory=kv_memory, tegrastats=sup)
