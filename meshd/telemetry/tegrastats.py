"""A pure parser for one line of NVIDIA's ``tegrastats`` output (Jetson boards).

The format changed between L4T releases; every field is optional and read on its own, so a
line from any release gives what it has and unknown tokens are ignored. Examples::

    RAM 2448/3964MB (lfb 1x2MB) SWAP 0/1982MB (cached 0MB) CPU [11%@102,9%@102,off,off]
        EMC_FREQ 0% GR3D_FREQ 0% PLL@28.5C CPU@30.5C GPU@29.5C POM_5V_IN 1942/1942
    RAM 2513/7620MB ... CPU [1%@729,...] EMC_FREQ 0%@2133 GR3D_FREQ 0%@[305] ...
        CPU@46.25C GPU@-256C tj@46.25C VDD_IN 4071mW/4071mW

``parse_tegrastats`` never raises on any string: figures it cannot find are ``None``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_LINE = 4096
OFF_SENSOR_C = -256.0  # what Tegra prints for a powered-off thermal sensor

_RAM = re.compile(r"\bRAM (\d{1,9})/(\d{1,9})MB")
_SWAP = re.compile(r"\bSWAP (\d{1,9})/(\d{1,9})MB")
_CPU = re.compile(r"\bCPU \[([^\]]{0,1024})\]")
_CORE = re.compile(r"^(\d{1,3})%(?:@(\d{1,6}))?$")
_EMC = re.compile(r"\bEMC_FREQ (\d{1,3})%")
_GR3D = re.compile(r"\bGR3D_FREQ (\d{1,3})%(?:@\[?(\d{1,6}))?")
_TEMP = re.compile(r"(?<![\w@%])([A-Za-z][\w-]{0,31})@(-?\d{1,6}(?:\.\d{1,6})?)C(?!\w)")
_RAIL = re.compile(r"(?<![\w/])([A-Z][A-Z0-9_]{1,31}) (\d{1,9})(?:mW)?/(\d{1,9})(?:mW)?(?![\w/])")
_NOT_RAILS = frozenset({"RAM", "SWAP", "IRAM"})


@dataclass(frozen=True, slots=True)
class TegraStats:
    """The figures of one tegrastats line. Per-core CPU entries are ``None`` for a core that
    is off; temperatures are (sensor, degrees C) pairs in line order without powered-off
    sensors; ``power_mw`` holds each rail's current reading in milliwatts."""

    ram_used_mb: int | None = None
    ram_total_mb: int | None = None
    swap_used_mb: int | None = None
    swap_total_mb: int | None = None
    cpu_load_pct: tuple[float | None, ...] = ()
    cpu_freq_mhz: tuple[int | None, ...] = ()
    emc_load_pct: float | None = None
    gpu_load_pct: float | None = None
    gpu_freq_mhz: int | None = None
    temperatures_c: tuple[tuple[str, float], ...] = ()
    power_mw: tuple[tuple[str, int], ...] = ()

    def temperature_c(self, sensor: str) -> float | None:
        """The temperature of ``sensor`` (case-insensitive), if the line had it."""
        want = sensor.lower()
        for name, value in self.temperatures_c:
            if name.lower() == want:
                return value
        return None

    @property
    def gpu_temperature_c(self) -> float | None:
        return self.temperature_c("GPU")


def parse_tegrastats(line: str) -> TegraStats:
    """Parse one tegrastats line (see the module docstring). Never raises."""
    text = line[:MAX_LINE]
    ram_used = ram_total = swap_used = swap_total = None
    if m := _RAM.search(text):
        ram_used, ram_total = int(m[1]), int(m[2])
    if m := _SWAP.search(text):
        swap_used, swap_total = int(m[1]), int(m[2])

    loads: list[float | None] = []
    freqs: list[int | None] = []
    if m := _CPU.search(text):
        for entry in m[1].split(","):
            core = _CORE.match(entry.strip())
            loads.append(float(core[1]) if core else None)
            freqs.append(int(core[2]) if core and core[2] else None)

    emc = float(m[1]) if (m := _EMC.search(text)) else None
    gpu_load = gpu_freq = None
    if m := _GR3D.search(text):
        gpu_load = float(m[1])
        gpu_freq = int(m[2]) if m[2] else None

    temps: list[tuple[str, float]] = []
    seen: set[str] = set()
    for m in _TEMP.finditer(text):
        value = float(m[2])
        if value <= OFF_SENSOR_C or m[1] in seen:
            continue
        seen.add(m[1])
        temps.append((m[1], value))

    rails: list[tuple[str, int]] = []
    for m in _RAIL.finditer(text):
        if m[1] not in _NOT_RAILS and m[1] not in {r for r, _ in rails}:
            rails.append((m[1], int(m[2])))

    return TegraStats(
        ram_used_mb=ram_used,
        ram_total_mb=ram_total,
        swap_used_mb=swap_used,
        swap_total_mb=swap_total,
        cpu_load_pct=tuple(loads),
        cpu_freq_mhz=tuple(freqs),
        emc_load_pct=emc,
        gpu_load_pct=gpu_load,
        gpu_freq_mhz=gpu_freq,
        temperatures_c=tuple(temps),
        power_mw=tuple(rails),
    )
