"""NVIDIA Jetson (Tegra) boards, where NVML is absent: the GPU is read through sysfs.

A Jetson is recognised by ``/etc/nv_tegra_release``, a device-tree model naming a Jetson, or
the Tegra GPU's sysfs node. Its GPU shares the CPU's memory, so its memory figures are the
system's; its load comes from the GPU node's ``load`` file (per mille), its temperature from
the GPU thermal zone, and a tegrastats line, when the caller has one, fills what sysfs lacks.
All paths are under ``root`` so tests build a fake board in a temporary directory.
"""

from __future__ import annotations

import re
from pathlib import Path

from meshd.telemetry.hardware import GpuInfo
from meshd.telemetry.procfs import read_text
from meshd.telemetry.tegrastats import TegraStats

RELEASE_FILE = "etc/nv_tegra_release"
MODEL_FILE = "proc/device-tree/model"
GPU_NODES = ("sys/devices/gpu.0", "sys/devices/platform/gpu.0")
# The GPU load file across L4T releases and modules (Nano/TX: gpu.0; Xavier: gv11b; Orin: ga10b).
GPU_LOAD_FILES = (
    "sys/devices/gpu.0/load",
    "sys/devices/platform/gpu.0/load",
    "sys/devices/platform/17000000.ga10b/load",
    "sys/devices/platform/17000000.gv11b/load",
    "sys/devices/platform/17000000.gpu/load",
    "sys/devices/platform/bus@0/17000000.gpu/load",
)
_GPU_ZONE_TYPES = ("gpu-therm", "gpu-thermal", "gpu_therm", "gpu")
_RELEASE = re.compile(r"R(\d+)\s*\(release\),\s*REVISION:\s*([0-9.]+)")
_PER_MILLE = re.compile(r"[0-9]{1,7}")
_MIB = 1 << 20


def board_model(root: Path) -> str:
    """The device-tree model (``NVIDIA Jetson Nano Developer Kit``), or ``""``."""
    return (read_text(root / MODEL_FILE) or "").replace("\x00", "").strip()


def is_jetson(root: Path) -> bool:
    if (root / RELEASE_FILE).is_file() or "jetson" in board_model(root).lower():
        return True
    return any((root / node).is_dir() for node in GPU_NODES)


def l4t_release(root: Path) -> str:
    """``L4T R32.7.1`` from ``/etc/nv_tegra_release``, or ``""``."""
    m = _RELEASE.search(read_text(root / RELEASE_FILE) or "")
    return f"L4T R{m[1]}.{m[2].rstrip('.')}" if m else ""


def gpu_load_pct(root: Path) -> float | None:
    """The GPU load in percent from the first readable sysfs ``load`` file (per mille)."""
    for rel in GPU_LOAD_FILES:
        raw = (read_text(root / rel) or "").strip()
        if _PER_MILLE.fullmatch(raw):
            return min(int(raw), 1000) / 10.0
    return None


def gpu_temperature_c(thermal_c: tuple[tuple[str, float], ...]) -> float | None:
    """The GPU zone's temperature among the thermal zones read, if there is one."""
    by_type = {name.lower(): value for name, value in thermal_c}
    for kind in _GPU_ZONE_TYPES:
        if kind in by_type:
            return by_type[kind]
    return None


def jetson_gpu(
    root: Path,
    *,
    memory_total_bytes: int,
    memory_available_bytes: int,
    thermal_c: tuple[tuple[str, float], ...],
    tegra: TegraStats | None = None,
) -> GpuInfo:
    """The Jetson's one integrated GPU, from sysfs first and the tegrastats line second."""
    load = gpu_load_pct(root)
    temp = gpu_temperature_c(thermal_c)
    total, free = memory_total_bytes, memory_available_bytes
    if tegra is not None:
        load = load if load is not None else tegra.gpu_load_pct
        temp = temp if temp is not None else tegra.gpu_temperature_c
        if not total and tegra.ram_total_mb is not None and tegra.ram_used_mb is not None:
            total = tegra.ram_total_mb * _MIB
            free = max(0, tegra.ram_total_mb - tegra.ram_used_mb) * _MIB
    board = board_model(root)
    return GpuInfo(
        index=0,
        name=f"{board} GPU" if board else "Tegra GPU",
        memory_total_bytes=total,
        memory_free_bytes=free,
        utilisation_pct=load,
        temperature_c=temp,
        driver_version=l4t_release(root),
        shared_memory=True,
    )
