"""NVIDIA GPUs through NVML (``pynvml`` from the nvidia-ml-py package).

NVML is a foreign library that fails in many ways: not installed, no driver, a driver/library
mismatch, a GPU that fell off the bus, a query a board does not support. Every failure here
means fewer figures, never an exception: NVML that cannot start means no GPUs, a GPU whose
identity or memory cannot be read is left out, and a figure a GPU does not report is ``None``.
"""

from __future__ import annotations

import logging
from typing import Any

from meshd.telemetry.hardware import MAX_GPUS, GpuInfo

log = logging.getLogger(__name__)

# The pynvml names this module uses; a test checks that the real module has each of them, so
# the fake in meshd.testing cannot drift from the real API.
USED_NAMES = (
    "nvmlInit",
    "nvmlShutdown",
    "nvmlSystemGetDriverVersion",
    "nvmlDeviceGetCount",
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetName",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetTemperature",
    "NVML_TEMPERATURE_GPU",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetEnforcedPowerLimit",
    "nvmlDeviceGetClockInfo",
    "nvmlDeviceGetMaxClockInfo",
    "NVML_CLOCK_SM",
    "nvmlDeviceGetCurrentClocksThrottleReasons",
)

# NVML's clock throttle reason bits that mean the GPU runs slower than it could (idle, the
# application clock setting, sync boost and the display clock are left out: not a slowdown).
THROTTLE_BITS = (
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x20, "sw_thermal"),
    (0x40, "hw_thermal"),
    (0x80, "hw_power_brake"),
)
INIT_RETRY_MAX_READS = 64  # NVML that never started is tried again after 1, 2, 4 ... 64 reads


def throttle_reasons(mask: int) -> tuple[str, ...]:
    """The names of the slowdown bits set in an NVML throttle-reasons mask, in bit order."""
    return tuple(name for bit, name in THROTTLE_BITS if mask & bit)


def load_pynvml() -> Any | None:
    """The ``pynvml`` module, or ``None`` when it cannot be imported."""
    try:
        import pynvml
    except Exception:  # ImportError, or a broken install raising anything at import
        return None
    return pynvml


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def _brief(err: BaseException) -> str:
    return str(err).strip().splitlines()[0][:60] if str(err).strip() else type(err).__name__


class NvmlGpus:
    """Reads every NVML GPU. NVML is initialised once, on the first read; ``close()`` shuts it
    down. ``nvml`` is the pynvml module (or a fake with the same names); ``None`` imports it.

    ``note`` says why the last read found no GPU or left one out (empty when all was read).
    ``error`` is set when a read that should have worked failed (NVML started, then a query
    failed): the caller reports it once and reads again next time. NVML that cannot start (no
    library, no driver) is absence, not an error: it is tried again after 1, 2, 4 ... 64 reads.
    """

    def __init__(self, nvml: Any | None = None) -> None:
        self._nvml = nvml
        self._state = "new"  # "new" -> "ok" | "failed"; "closed" after close()
        self._driver = ""
        self._retry_in = 0  # reads to skip before trying a failed start again
        self._retry_gap = 1
        self.note = ""
        self.error = ""

    def _start(self) -> bool:
        if self._state == "failed" and self._retry_in <= 0:
            self._state = "new"
        elif self._state == "failed":
            self._retry_in -= 1
        if self._state == "new":
            nvml = self._nvml if self._nvml is not None else load_pynvml()
            if nvml is None:
                self._state, self.note = "failed", "nvml: pynvml not installed"
                self._backoff()
                return False
            try:
                nvml.nvmlInit()
            except Exception as err:
                if self.note != f"nvml: {_brief(err)}":
                    log.info("nvml unavailable reason=%r", f"nvml: {_brief(err)}")
                self._state, self.note = "failed", f"nvml: {_brief(err)}"
                self._backoff()
                return False
            self._retry_gap = 1
            self._nvml, self._state = nvml, "ok"
            try:
                self._driver = _text(nvml.nvmlSystemGetDriverVersion())
            except Exception as err:
                log.debug("nvml driver version unreadable error=%r", err)
        return self._state == "ok"

    def _backoff(self) -> None:
        self._retry_in = self._retry_gap
        self._retry_gap = min(self._retry_gap * 2, INIT_RETRY_MAX_READS)

    def read(self) -> tuple[GpuInfo, ...]:
        self.error = ""
        if not self._start():
            return ()
        nvml: Any = self._nvml
        notes: list[str] = []
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except Exception as err:
            self.note = self.error = f"nvml: device count: {_brief(err)}"
            return ()
        gpus = []
        for index in range(min(count, MAX_GPUS)):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                name = _text(nvml.nvmlDeviceGetName(handle))
                mem = nvml.nvmlDeviceGetMemoryInfo(handle)
                total, free = int(mem.total), int(mem.free)
            except Exception as err:
                notes.append(f"nvml: gpu {index}: {_brief(err)}")
                continue
            gpus.append(self._live(nvml, handle, index, name, total, free, getattr(mem, "used", None)))
        self.note = self.error = "; ".join(notes)
        return tuple(gpus)

    def _live(self, nvml: Any, h: Any, index: int, name: str, total: int, free: int,
              used: object) -> GpuInfo:
        """One GPU's live figures; a figure the board does not report is ``None``."""
        opt = self._optional
        power_mw = opt(lambda: nvml.nvmlDeviceGetPowerUsage(h))
        limit_mw = opt(lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(h))
        sm_now = opt(lambda: nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM))
        sm_max = opt(lambda: nvml.nvmlDeviceGetMaxClockInfo(h, nvml.NVML_CLOCK_SM))
        mask = opt(lambda: nvml.nvmlDeviceGetCurrentClocksThrottleReasons(h))
        return GpuInfo(
            index=index,
            name=name,
            memory_total_bytes=total,
            memory_free_bytes=free,
            utilisation_pct=opt(lambda: nvml.nvmlDeviceGetUtilizationRates(h).gpu),
            temperature_c=opt(lambda: nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU)),
            driver_version=self._driver,
            memory_used_bytes=int(used) if isinstance(used, int) and used >= 0 else None,
            power_draw_w=power_mw / 1000.0 if power_mw is not None else None,
            power_limit_w=limit_mw / 1000.0 if limit_mw else None,
            clock_ratio=min(1.0, sm_now / sm_max) if sm_now is not None and sm_max else None,
            throttle=throttle_reasons(int(mask)) if mask is not None else (),
        )

    @staticmethod
    def _optional(query: Any) -> float | None:
        try:
            return float(query())
        except Exception:  # NotSupported on many boards; a figure we simply do not have
            return None

    def close(self) -> None:
        if self._state == "ok":
            nvml: Any = self._nvml
            try:
                nvml.nvmlShutdown()
            except Exception as err:
                log.debug("nvml shutdown failed error=%r", err)
        self._state = "closed"
