"""Fakes for the telemetry edge: a ``TelemetrySource``, a stand-in ``pynvml`` module, and a
builder of a fake Jetson sysfs tree.

``FakeNvml`` has the names ``meshd.telemetry.nvml`` uses (a test checks them against the real
pynvml) and can fail in the ways NVML does: at init, or for one query of one GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from meshd.telemetry.hardware import Hardware
from meshd.telemetry.source import TelemetrySource

CPU_ONLY = Hardware(
    kind="cpu",
    cpu_cores=4,
    cpu_model="Fake CPU",
    memory_total_bytes=8 << 30,
    memory_available_bytes=6 << 30,
)


class FakeTelemetrySource:
    """Returns ``hardware`` (which a test may replace between reads); counts reads."""

    def __init__(self, hardware: Hardware = CPU_ONLY) -> None:
        self.hardware = hardware
        self.reads = 0
        self.closed = False

    def read(self) -> Hardware:
        self.reads += 1
        return self.hardware

    def close(self) -> None:
        self.closed = True


def _conforms(source: FakeTelemetrySource) -> TelemetrySource:
    return source  # mypy checks that the fake satisfies the Protocol


class NVMLError(Exception):
    """Stands for ``pynvml.NVMLError`` (the real one carries a numeric code)."""


@dataclass
class FakeGpu:
    name: str = "NVIDIA Fake 24GB"
    memory_total_bytes: int = 24 << 30
    memory_free_bytes: int = 20 << 30
    utilisation_pct: int = 37
    temperature_c: int = 51


@dataclass
class FakeNvml:
    """A stand-in for the ``pynvml`` module.

    ``fail_init`` makes ``nvmlInit`` raise (no driver). ``fail`` maps a pynvml function name to
    the GPU indices for which it raises (``{"nvmlDeviceGetMemoryInfo": {1}}``); index ``-1``
    means every call.
    """

    gpus: list[FakeGpu] = field(default_factory=list)
    fail_init: bool = False
    fail: dict[str, set[int]] = field(default_factory=dict)
    driver_version: str = "550.54.15"
    init_calls: int = 0
    shutdown_calls: int = 0

    NVML_TEMPERATURE_GPU = 0
    NVMLError = NVMLError

    def _check(self, fn: str, index: int = -1) -> None:
        bad = self.fail.get(fn, set())
        if index in bad or -1 in bad:
            raise NVMLError(f"{fn} failed for gpu {index}")

    def nvmlInit(self) -> None:
        self.init_calls += 1
        if self.fail_init:
            raise NVMLError("NVML Shared Library Not Found")

    def nvmlShutdown(self) -> None:
        self.shutdown_calls += 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._check("nvmlSystemGetDriverVersion")
        return self.driver_version

    def nvmlDeviceGetCount(self) -> int:
        self._check("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        self._check("nvmlDeviceGetHandleByIndex", index)
        return index

    def nvmlDeviceGetName(self, handle: int) -> bytes:
        self._check("nvmlDeviceGetName", handle)
        return self.gpus[handle].name.encode()  # older pynvml returns bytes

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Any:
        self._check("nvmlDeviceGetMemoryInfo", handle)
        g = self.gpus[handle]
        used = g.memory_total_bytes - g.memory_free_bytes
        return SimpleNamespace(total=g.memory_total_bytes, free=g.memory_free_bytes, used=used)

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> Any:
        self._check("nvmlDeviceGetUtilizationRates", handle)
        return SimpleNamespace(gpu=self.gpus[handle].utilisation_pct, memory=0)

    def nvmlDeviceGetTemperature(self, handle: int, sensor: int) -> int:
        self._check("nvmlDeviceGetTemperature", handle)
        assert sensor == self.NVML_TEMPERATURE_GPU
        return self.gpus[handle].temperature_c


def build_jetson_tree(
    root: Path,
    *,
    model: str = "NVIDIA Jetson Nano Developer Kit",
    release: str | None = (
        "# R32 (release), REVISION: 7.1, GCID: 29818004, BOARD: t210ref, EABI: aarch64, "
        "DATE: Sat Feb 19 17:05:08 UTC 2022"
    ),
    gpu_load_file: str = "sys/devices/gpu.0/load",
    gpu_load_per_mille: int | None = 253,
    zones: dict[str, int] | None = None,
    mem_total_kb: int = 4059712,
    mem_available_kb: int = 1553324,
) -> Path:
    """Write a Jetson-like /proc, /sys and /etc under ``root``; returns ``root``.

    ``zones`` maps thermal zone types to millidegrees (default: a Nano's zones).
    """

    def write(rel: str, text: str) -> None:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)

    write(
        "proc/meminfo",
        f"MemTotal:       {mem_total_kb} kB\nMemFree:          402112 kB\n"
        f"MemAvailable:   {mem_available_kb} kB\nBuffers:           87652 kB\n",
    )
    write(
        "proc/cpuinfo",
        "processor\t: 0\nmodel name\t: ARMv8 Processor rev 1 (v8l)\nBogoMIPS\t: 38.40\n"
        "CPU implementer\t: 0x41\nCPU part\t: 0xd04\n\n",
    )
    write("proc/device-tree/model", model + "\x00")
    if release is not None:
        write("etc/nv_tegra_release", release + "\n")
    if gpu_load_per_mille is not None:
        write(gpu_load_file, f"{gpu_load_per_mille}\n")
    default_zones = {"AO-therm": 37500, "CPU-therm": 30500, "GPU-therm": 29500, "PLL-therm": 28500}
    for i, (kind, milli) in enumerate((default_zones if zones is None else zones).items()):
        write(f"sys/class/thermal/thermal_zone{i}/type", kind + "\n")
        write(f"sys/class/thermal/thermal_zone{i}/temp", f"{milli}\n")
    return root
