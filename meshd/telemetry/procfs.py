"""Figures read from /proc and /sys: memory, CPU model, thermal zones, this process's usage.

Every reader takes ``root`` (the directory that stands for ``/``) so tests build a fake tree in
a temporary directory, and every reader returns a default instead of raising when a file is
missing or unreadable: hardware discovery never crashes the daemon. The parsers are pure
functions over file text.
"""

from __future__ import annotations

import os
import platform
import resource
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from meshd.telemetry.hardware import MAX_THERMAL_ZONES

MAX_TRIP_POINTS = 12
MAX_CPUS = 1024
_CPU_MODEL_KEYS = ("model name", "cpu model", "processor", "hardware", "cpu")


def read_text(path: Path, limit: int = 1 << 16) -> str | None:
    """The text of a small file, or ``None`` when it cannot be read (absent, EINVAL, EPERM)."""
    try:
        with open(path, "rb") as f:
            return f.read(limit).decode("utf-8", "replace")
    except OSError:
        return None


def parse_meminfo(text: str) -> dict[str, int]:
    """``/proc/meminfo`` as {field: bytes}. Lines that do not parse are skipped."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, sep, rest = line.partition(":")
        parts = rest.split()
        if not sep or not parts:
            continue
        try:
            value = int(parts[0])
        except ValueError:
            continue
        unit = parts[1].lower() if len(parts) > 1 else ""
        out[key.strip()] = value * 1024 if unit == "kb" else value
    return out


def memory_bytes(root: Path) -> tuple[int, int]:
    """(total, available) bytes from ``/proc/meminfo``; (0, 0) when unreadable.

    Kernels before 3.14 have no ``MemAvailable``: free + buffers + page cache stands in.
    """
    text = read_text(root / "proc/meminfo")
    info = parse_meminfo(text) if text else {}
    total = info.get("MemTotal", 0)
    if "MemAvailable" in info:
        available = info["MemAvailable"]
    else:
        available = info.get("MemFree", 0) + info.get("Buffers", 0) + info.get("Cached", 0)
    return total, min(available, total) if total else available


def parse_cpu_model(text: str) -> str:
    """The CPU model from ``/proc/cpuinfo`` text: x86 ``model name``, else what ARM offers."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        key = key.strip().lower()
        if sep and value.strip() and key not in fields:
            fields[key] = value.strip()
    for key in _CPU_MODEL_KEYS:
        value = fields.get(key, "")
        if value and not value.isdigit():  # x86 "processor : 0" is an index, not a name
            return value
    return ""


def cpu_model(root: Path) -> str:
    text = read_text(root / "proc/cpuinfo", limit=1 << 20)
    return (parse_cpu_model(text) if text else "") or platform.machine() or "unknown"


def thermal_zones(root: Path) -> tuple[tuple[str, float], ...]:
    """(zone type, degrees C) for each readable ``/sys/class/thermal/thermal_zone*``."""
    return thermal_state(root)[0]


def thermal_state(root: Path) -> tuple[tuple[tuple[str, float], ...], tuple[str, ...]]:
    """The thermal zones, and ``"thermal:<zone type>"`` for each zone at or above one of its
    ``passive`` trip points (where the kernel starts slowing the CPU or GPU down).

    Zones that report an error or a sentinel (Tegra reports -256 C for a powered-off sensor)
    are skipped; a type seen twice gets the zone number appended.
    """
    base = root / "sys/class/thermal"
    try:
        zones = sorted(
            (p for p in base.iterdir() if p.name.startswith("thermal_zone")),
            key=lambda p: (len(p.name), p.name),
        )
    except OSError:
        return (), ()
    out: dict[str, float] = {}
    hot: list[str] = []
    for zone in zones:
        if len(out) >= MAX_THERMAL_ZONES:
            break
        kind = (read_text(zone / "type") or "").strip() or zone.name
        milli = _int_file(zone / "temp")
        if milli is None:
            continue
        celsius = milli / 1000.0
        if not -100.0 < celsius < 200.0:
            continue
        if kind in out:
            kind = f"{kind}.{zone.name.removeprefix('thermal_zone')}"
        out[kind] = celsius
        if at_passive_trip(zone, milli):
            hot.append(f"thermal:{kind}")
    return tuple(sorted(out.items())), tuple(hot)


def at_passive_trip(zone: Path, milli: int) -> bool:
    """Whether ``milli`` (the zone's temperature) reaches one of its passive trip points."""
    for i in range(MAX_TRIP_POINTS):
        kind = read_text(zone / f"trip_point_{i}_type")
        if kind is None:
            return False
        trip = _int_file(zone / f"trip_point_{i}_temp")
        if kind.strip() == "passive" and trip is not None and trip > 0 and milli >= trip:
            return True
    return False


def _int_file(path: Path) -> int | None:
    try:
        return int((read_text(path) or "").strip())
    except ValueError:
        return None


def parse_loadavg(text: str) -> float | None:
    """The 1-minute load average from ``/proc/loadavg`` text."""
    try:
        value = float(text.split()[0])
    except (IndexError, ValueError):
        return None
    return value if 0.0 <= value < 1e6 else None


def load_1m(root: Path) -> float | None:
    text = read_text(root / "proc/loadavg")
    return parse_loadavg(text) if text else None


def cpu_clock_ratio(root: Path) -> float | None:
    """The CPUs' clock now over their maximum (cpufreq), averaged over the CPUs that report
    both; ``None`` where cpufreq is absent (most VMs)."""
    base = root / "sys/devices/system/cpu"
    now = top = 0
    for i in range(MAX_CPUS):
        freq = base / f"cpu{i}" / "cpufreq"
        cur, hi = _int_file(freq / "scaling_cur_freq"), _int_file(freq / "cpuinfo_max_freq")
        if cur is None and hi is None and not (base / f"cpu{i}").exists():
            break
        if cur is not None and hi and cur > 0:
            now, top = now + cur, top + hi
    return round(min(1.0, now / top), 3) if top else None


@dataclass(frozen=True, slots=True)
class ProcessStats:
    """This process's footprint at one instant: resident memory and CPU time used so far."""

    rss_bytes: int
    cpu_user_s: float
    cpu_system_s: float

    @property
    def cpu_s(self) -> float:
        return self.cpu_user_s + self.cpu_system_s

    def cpu_percent_since(self, earlier: ProcessStats, elapsed_s: float) -> float:
        """Percent of one core used between ``earlier`` and this reading, ``elapsed_s`` apart."""
        if elapsed_s <= 0:
            return 0.0
        return max(0.0, self.cpu_s - earlier.cpu_s) / elapsed_s * 100.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "rss_bytes": self.rss_bytes,
            "cpu_user_s": self.cpu_user_s,
            "cpu_system_s": self.cpu_system_s,
        }


def parse_vmrss(text: str) -> int | None:
    """``VmRSS`` in bytes from ``/proc/<pid>/status`` text, or ``None`` if absent."""
    for line in text.splitlines():
        if line.startswith("VmRSS:"):
            parts = line.split()
            try:
                return int(parts[1]) * 1024
            except (IndexError, ValueError):
                return None
    return None


def process_stats(root: Path | str = "/") -> ProcessStats:
    """RSS from ``/proc/self/status`` (falling back to the peak RSS from ``getrusage`` where
    /proc is absent) and CPU seconds from ``os.times()``."""
    text = read_text(Path(root) / "proc/self/status")
    rss = parse_vmrss(text) if text else None
    if rss is None:
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kB on Linux
    t = os.times()
    return ProcessStats(rss_bytes=rss, cpu_user_s=t.user, cpu_system_s=t.system)
