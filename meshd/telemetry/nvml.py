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
)


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
    """

    def __init__(self, nvml: Any | None = None) -> None:
        self._nvml = nvml
        self._state = "new"  # "new" -> "ok" | "failed"; "closed" after close()
        self._driver = ""
        self.note = ""

    def _start(self) -> bool:
        if self._state == "new":
            nvml = self._nvml if self._nvml is not None else load_pynvml()
            if nvml is None:
                self._state, self.note = "failed", "nvml: pynvml not installed"
                return False
            try:
                nvml.nvmlInit()
            except Exception as err:
                self._state, self.note = "failed", f"nvml: {_brief(err)}"
                log.info("nvml unavailable reason=%r", self.note)
                return False
            self._nvml, self._state = nvml, "ok"
            try:
                self._driver = _text(nvml.nvmlSystemGetDriverVersion())
            except Exception as err:
                log.debug("nvml driver version unreadable error=%r", err)
        return self._state == "ok"

    def read(self) -> tuple[GpuInfo, ...]:
        if not self._start():
            return ()
        nvml: Any = self._nvml
        notes: list[str] = []
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except Exception as err:
            self.note = f"nvml: device count: {_brief(err)}"
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
            gpus.append(
                GpuInfo(
                    index=index,
                    name=name,
                    memory_total_bytes=total,
                    memory_free_bytes=free,
                    utilisation_pct=self._optional(
                        lambda h=handle: nvml.nvmlDeviceGetUtilizationRates(h).gpu
                    ),
                    temperature_c=self._optional(
                        lambda h=handle: nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU)
                    ),
                    driver_version=self._driver,
                )
            )
        self.note = "; ".join(notes)
        if notes:
            log.info("nvml gpu left out reason=%r", self.note)
        return tuple(gpus)

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
