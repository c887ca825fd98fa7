"""Fakes for the telemetry edge: a ``TelemetrySource``, a stand-in ``pynvml`` module, and a
builder of a fake Jetson sysfs tree.

``FakeNvml`` has the names ``meshd.telemetry.nvml`` uses (a test checks them against the real
pynvml) and can fail in the ways NVML does: at init, or for one query of one GPU.
"""

from __future__ import annotations

import dataclasses
import json
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
    power_mw: int = 72_000
    power_limit_mw: int = 300_000
    sm_clock_mhz: int = 1_980
    sm_max_clock_mhz: int = 1_980
    throttle_mask: int = 0  # NVML clocks throttle reasons (0x40: hardware thermal slowdown)


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
    NVML_CLOCK_SM = 1
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

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:
        self._check("nvmlDeviceGetPowerUsage", handle)
        return self.gpus[handle].power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: int) -> int:
        self._check("nvmlDeviceGetEnforcedPowerLimit", handle)
        return self.gpus[handle].power_limit_mw

    def nvmlDeviceGetClockInfo(self, handle: int, clock: int) -> int:
        self._check("nvmlDeviceGetClockInfo", handle)
        assert clock == self.NVML_CLOCK_SM
        return self.gpus[handle].sm_clock_mhz

    def nvmlDeviceGetMaxClockInfo(self, handle: int, clock: int) -> int:
        self._check("nvmlDeviceGetMaxClockInfo", handle)
        assert clock == self.NVML_CLOCK_SM
        return self.gpus[handle].sm_max_clock_mhz

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: int) -> int:
        self._check("nvmlDeviceGetCurrentClocksThrottleReasons", handle)
        return self.gpus[handle].throttle_mask


class FileNvml(FakeNvml):
    """A ``FakeNvml`` whose GPUs and failures are read from a JSON file at every device count,
    so a test changes what a running daemon's NVML reports by rewriting the file:
    ``{"gpus": [{FakeGpu fields}], "fail": {"nvmlDeviceGetCount": [-1]}}``. The daemon uses
    it when ``MESHD_TEST_FAKE_NVML`` names such a file (meshd.node.daemon)."""

    def __init__(self, path: str | Path) -> None:
        super().__init__()
        self.path = Path(path)

    def nvmlDeviceGetCount(self) -> int:
        state = json.loads(self.path.read_text())
        self.gpus = [FakeGpu(**g) for g in state.get("gpus", [])]
        self.fail = {k: set(v) for k, v in state.get("fail", {}).items()}
        return super().nvmlDeviceGetCount()


def write_nvml_state(path: Path, gpus: list[FakeGpu], fail: dict[str, list[int]] | None = None) -> None:
    """Write the file a ``FileNvml`` reads (atomically: a daemon may be reading it)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"gpus": [dataclasses.asdict(g) for g in gpus], "fail": fail or {}}))
    tmp.replace(path)


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


def _write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)  # a daemon reading the tree never sees half a file


def build_host_tree(
    root: Path,
    *,
    mem_total_kb: int = 16 << 20,
    mem_available_kb: int = 12 << 20,
    load_1m: float = 0.5,
    zones: dict[str, tuple[int, int | None]] | None = None,
    cpu_mhz: tuple[int, int] | None = (2_400_000, 3_000_000),
    rapl_uj: int | None = None,
) -> Path:
    """Write a CPU host's /proc and /sys under ``root`` (call again to change a reading).

    ``zones`` maps thermal zone types to (millidegrees, passive trip millidegrees or None);
    ``cpu_mhz`` is (scaling_cur_freq, cpuinfo_max_freq) in kHz for cpu0; ``rapl_uj`` the
    package energy counter (None: no RAPL).
    """
    _write(root, "proc/meminfo", f"MemTotal: {mem_total_kb} kB\nMemFree: {mem_available_kb // 2} kB\n"
                                 f"MemAvailable: {mem_available_kb} kB\n")
    _write(root, "proc/cpuinfo", "processor\t: 0\nmodel name\t: Fake CPU @ 3.0GHz\n\n")
    _write(root, "proc/loadavg", f"{load_1m:.2f} 0.40 0.30 1/123 4567\n")
    for i, (kind, (milli, trip)) in enumerate((zones or {"x86_pkg_temp": (45_000, 95_000)}).items()):
        zone = f"sys/class/thermal/thermal_zone{i}"
        _write(root, f"{zone}/type", kind + "\n")
        _write(root, f"{zone}/temp", f"{milli}\n")
        if trip is not None:
            _write(root, f"{zone}/trip_point_0_type", "passive\n")
            _write(root, f"{zone}/trip_point_0_temp", f"{trip}\n")
    if cpu_mhz is not None:
        _write(root, "sys/devices/system/cpu/cpu0/cpufreq/scaling_cur_freq", f"{cpu_mhz[0]}\n")
        _write(root, "sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq", f"{cpu_mhz[1]}\n")
    if rapl_uj is not None:
        _write(root, "sys/class/powercap/intel-rapl:0/energy_uj", f"{rapl_uj}\n")
        _write(root, "sys/class/powercap/intel-rapl:0/max_energy_range_uj", f"{1 << 32}\n")
    return root
