"""The telemetry edge: ``TelemetrySource`` and the real source that reads this host.

The node asks its source for a ``Hardware`` reading each advert interval. ``HostTelemetry``
combines the readers: memory and CPU from /proc, thermal zones from /sys, GPUs through NVML,
or, where NVML finds none and the board is a Jetson, through Tegra sysfs (and a tegrastats line
if the caller has one). Nothing found means ``kind == "cpu"``; nothing here raises.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Protocol

from meshd.telemetry import jetson
from meshd.telemetry.hardware import Hardware
from meshd.telemetry.nvml import NvmlGpus
from meshd.telemetry.procfs import cpu_model, memory_bytes, thermal_zones
from meshd.telemetry.tegrastats import parse_tegrastats

log = logging.getLogger(__name__)


class TelemetrySource(Protocol):
    """Where a node's hardware figures come from (``meshd.testing.fakes_telemetry`` has a
    fake). ``read`` must not raise and should take well under a millisecond or two."""

    def read(self) -> Hardware: ...

    def close(self) -> None: ...


class HostTelemetry:
    """The real source. ``root`` stands for ``/`` (tests point it at a fake tree); ``nvml`` is
    the pynvml module or a fake of it (``None`` imports pynvml on the first read).

    Static facts (CPU model, board) are read once; live figures on every ``read``.
    """

    def __init__(self, *, root: str | os.PathLike[str] = "/", nvml: Any | None = None) -> None:
        self._root = Path(root)
        self._nvml = NvmlGpus(nvml)
        self._cpu_model: str | None = None
        self._jetson: bool | None = None
        self.last_tegrastats: str | None = None

    def feed_tegrastats(self, line: str) -> None:
        """Remember the latest tegrastats line (from a ``tegrastats`` process the caller runs);
        later reads use it for figures that sysfs lacks."""
        self.last_tegrastats = line

    def read(self, tegrastats: str | None = None) -> Hardware:
        try:
            return self._read(tegrastats if tegrastats is not None else self.last_tegrastats)
        except Exception as err:  # a bug or a very odd host: report CPU only, keep running
            log.warning("hardware reading failed error=%r", err)
            return Hardware(
                kind="cpu",
                cpu_cores=os.cpu_count() or 1,
                cpu_model="unknown",
                memory_total_bytes=0,
                memory_available_bytes=0,
                notes=(f"telemetry: {type(err).__name__}",),
            )

    def _read(self, tegrastats: str | None) -> Hardware:
        root = self._root
        if self._cpu_model is None:
            self._cpu_model = cpu_model(root)
        total, available = memory_bytes(root)
        thermal = thermal_zones(root)
        gpus = self._nvml.read()
        notes = [self._nvml.note] if self._nvml.note else []
        kind, board = ("nvidia", "") if gpus else ("cpu", "")
        if not gpus:
            tegra = parse_tegrastats(tegrastats) if tegrastats else None
            if self._jetson is None:
                self._jetson = jetson.is_jetson(root)
            if self._jetson or (tegra is not None and tegra.gpu_load_pct is not None):
                kind, board = "jetson", jetson.board_model(root)
                notes = []  # NVML is expected to be absent on a Jetson
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
        )

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
