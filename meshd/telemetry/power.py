"""Measured power draw where NVML has none: the CPU package through RAPL, a Jetson's input rail.

RAPL (``/sys/class/powercap/intel-rapl:N/energy_uj``, also on recent AMD CPUs) is an energy
counter: the power is the energy between two readings over the time between them, so the first
reading gives nothing and the counter's wrap (``max_energy_range_uj``) is undone. Since Linux
5.10 the counter is readable by root only; a daemon that cannot read it reports no CPU power
(absence, not an error). A Jetson's tegrastats line names its input rail: ``VDD_IN`` (Xavier,
Orin) or ``POM_5V_IN`` (Nano, TX2), in milliwatts.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from meshd.telemetry.procfs import read_text
from meshd.telemetry.tegrastats import TegraStats

RAPL_BASE = "sys/class/powercap"
MAX_PACKAGES = 16
INPUT_RAILS = ("VDD_IN", "POM_5V_IN", "VIN_SYS_5V0")


def _counter(path: Path) -> int | None:
    try:
        return int((read_text(path) or "").strip())
    except ValueError:
        return None


class RaplPower:
    """Watts drawn by the CPU packages between two ``read`` calls (``None`` on the first, or
    where RAPL is absent or unreadable). ``clock`` gives seconds (monotonic)."""

    def __init__(self, root: Path, clock: Callable[[], float]) -> None:
        self._root = root
        self._clock = clock
        self._last: tuple[float, dict[str, int]] | None = None

    def _energy(self) -> tuple[dict[str, int], dict[str, int]]:
        base = self._root / RAPL_BASE
        energy: dict[str, int] = {}
        ranges: dict[str, int] = {}
        for i in range(MAX_PACKAGES):
            pkg = base / f"intel-rapl:{i}"
            uj = _counter(pkg / "energy_uj")
            if uj is None:
                if not pkg.exists():
                    break
                continue
            energy[pkg.name] = uj
            ranges[pkg.name] = _counter(pkg / "max_energy_range_uj") or 0
        return energy, ranges

    def read(self) -> float | None:
        now = self._clock()
        energy, ranges = self._energy()
        last, self._last = self._last, (now, energy) if energy else None
        if not energy or last is None or now <= last[0] or set(energy) != set(last[1]):
            return None
        joules = 0.0
        for name, uj in energy.items():
            delta = uj - last[1][name]
            if delta < 0:  # the counter wrapped
                delta += ranges.get(name, 0)
            if delta < 0:
                return None
            joules += delta / 1e6
        return round(joules / (now - last[0]), 3)


def input_power_w(tegra: TegraStats | None) -> float | None:
    """A Jetson's board input power in watts from its tegrastats line, if it names the rail."""
    if tegra is None:
        return None
    rails = dict(tegra.power_mw)
    for name in INPUT_RAILS:
        if name in rails:
            return rails[name] / 1000.0
    return None
