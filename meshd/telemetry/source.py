"""The telemetry edge: ``TelemetrySource`` and the real source that reads this host.

The node asks its source for a ``Hardware`` reading each advert interval. ``HostTelemetry``
combines the readers: memory and CPU from /proc, thermal zones from /sys, GPUs through NVML,
or, where NVML finds none and the board is a Jetson, through Tegra sysfs (and a tegrastats line
if the caller has one). Nothing found means ``kind == "cpu"``; nothing here raises.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from meshd.telemetry import jetson
from meshd.telemetry.hardware import GpuInfo, Hardware
from meshd.telemetry.nvml import NvmlGpus
from meshd.telemetry.power import RaplPower, input_power_w
from meshd.telemetry.procfs import cpu_clock_ratio, cpu_model, load_1m, memory_bytes, thermal_state
from meshd.telemetry.report import FailureReport
from meshd.telemetry.tegrastats import parse_tegrastats

log = logging.getLogger(__name__)


class TelemetrySource(Protocol):
    """Where a node's hardware figures come from (``meshd.testing.fakes_telemetry`` has a
    fake). ``read`` must not raise and should take well under a millisecond or two."""

    def read(self) -> Hardware: ...

    def close(self) -> None: ...


class HostTelemetry:
    """The real source. ``root`` stands for ``/`` (tests point it at a fake tree); ``nvml`` is
    the pynvml module or a fake of it (``None`` imports pynvml on the first read); ``clock``
    gives monotonic seconds (RAPL power is energy over time).

    Static facts (CPU model, board) are read once; live figures on every ``read``. A source
    whose reading fails (NVML started but a query failed, /proc/meminfo unreadable) is reported
    once through ``report``, keeps its last good figures, is named in ``Hardware.stale``, and
    is read again next time.
    """

    def __init__(self, *, root: str | os.PathLike[str] = "/", nvml: Any | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 report: FailureReport | None = None) -> None:
        self._root = Path(root)
        self._nvml = NvmlGpus(nvml)
        self._rapl = RaplPower(self._root, clock)
        self._clock = clock
        self._cpu_model: str | None = None
        self._jetson: bool | None = None
        self._gpus: tuple[GpuInfo, ...] = ()
        self._memory: tuple[int, int] = (0, 0)
        self.report = report or FailureReport()
        self.last_tegrastats: str | None = None

    def feed_tegrastats(self, line: str | None) -> None:
        """Remember the latest tegrastats line (from the ``tegrastats`` process the node
        supervises; ``None`` when it died); later reads use it for figures sysfs lacks."""
        self.last_tegrastats = line

    def read(self, tegrastats: str | None = None) -> Hardware:
        try:
            hw = self._read(tegrastats if tegrastats is not None else self.last_tegrastats)
            self.report.ok("telemetry")
            return hw
        except Exception as err:  # a bug or a very odd host: report CPU only, keep running
            self.report.failed("telemetry", repr(err))
            return Hardware(
                kind="cpu",
                cpu_cores=os.cpu_count() or 1,
                cpu_model="unknown",
                memory_total_bytes=0,
                memory_available_bytes=0,
                notes=(f"telemetry: {type(err).__name__}",),
                stale=("telemetry",),
            )

    def _read(self, tegrastats: str | None) -> Hardware:
        root = self._root
        if self._cpu_model is None:
            self._cpu_model = cpu_model(root)
        total, available = memory_bytes(root)
        self.report.check("procfs", "" if total else "/proc/meminfo unreadable")
        if total:
            self._memory = (total, available)
        elif self._memory[0]:
            total, available = self._memory  # the last good figures, marked stale
        thermal, hot = thermal_state(root)
        gpus = self._nvml.read()
        self.report.check("nvml", self._nvml.error)
        if self._nvml.error and not gpus:
            gpus = self._gpus  # NVML worked before: keep the GPUs, marked stale
        elif gpus:
            self._gpus = gpus
        notes = [self._nvml.note] if self._nvml.note else []
        kind, board = ("nvidia", "") if gpus else ("cpu", "")
        tegra = parse_tegrastats(tegrastats) if tegrastats else None
        power_w: float | None = None
        if not gpus:
            if self._jetson is None:
                self._jetson = jetson.is_jetson(root)
            if self._jetson or (tegra is not None and tegra.gpu_load_pct is not None):
                kind, board = "jetson", jetson.board_model(root)
                notes = []  # NVML is expected to be absent on a Jetson
                power_w = input_power_w(tegra)
                gpus = (
                    jetson.jetson_gpu(
                        root,
                        memory_total_bytes=total,
                        memory_available_bytes=available,
                        thermal_c=thermal,
                        tegra=tegra,
                    ),
                )
                if not total:
                    total, available = gpus[0].memory_total_bytes, gpus[0].memory_free_bytes
        rapl = self._rapl.read()
        return Hardware(
            kind=kind,
            cpu_cores=os.cpu_count() or 1,
            cpu_model=self._cpu_model,
            memory_total_bytes=total,
            memory_available_bytes=available,
            gpus=gpus,
            thermal_c=thermal,
            board=board,
            notes=tuple(notes),
            cpu_load_1m=load_1m(root),
            power_w=power_w if power_w is not None else rapl,
            cpu_clock_ratio=cpu_clock_ratio(root),
            throttle=hot,
            stale=tuple(s for s in self.report.failing if s != "telemetry"),
        )

    def statistics(self) -> dict[str, object]:
        return self.report.statistics()

    def close(self) -> None:
        self._nvml.close()


def read_hardware(
    *,
    root: str | os.PathLike[str] = "/",
    nvml: Any | None = None,
    tegrastats: str | None = None,
) -> Hardware:
    """One reading of this host's hardware (see ``HostTelemetry``). Never raises."""
    source = HostTelemetry(root=root, nvml=nvml)
    try:
        return source.read(tegrastats)
    finally:
        source.close()
