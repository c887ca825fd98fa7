"""What a node can compute with: the ``Hardware`` record that adverts carry.

Plain immutable values, no I/O. ``to_dict()`` gives only msgpack-friendly types (str, int,
float, bool, None, lists and maps of those) with units in the key names, capped so that a
hardware map always fits well inside an advert; ``from_dict()`` reads one back (from a peer's
advert) and raises only ``ProtocolError`` on anything malformed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgpack

from meshd.errors import ProtocolError

KINDS = ("cpu", "nvidia", "jetson")
MAX_GPUS = 16
MAX_THERMAL_ZONES = 16
MAX_NOTES = 4
MAX_TEXT = 64  # characters kept of a name, a model string or a note
MAX_VERSION = 32  # characters kept of a driver version
MAX_THROTTLE = 4  # host throttle reasons kept ("thermal:cpu-thermal")
MAX_REASON = 40  # characters kept of a host throttle reason
GPU_BUDGET_BYTES = 2560  # packed GPU maps an advert carries (eight typical GPUs), the rest left out
MAX_GPU_THROTTLE = 5  # NVML's slowdown reasons (meshd.telemetry.nvml.THROTTLE_BITS)
MAX_GPU_REASON = 16
MAX_STALE = 8  # names of sources whose last reading failed
KV_MEMORY = ("", "gpu", "host")


@dataclass(frozen=True, slots=True)
class GpuInfo:
    """One GPU. Figures that could not be read are ``None``, never a guess.

    ``shared_memory`` is true on a Jetson, where the GPU uses the CPU's memory: its memory
    figures are then the system's.
    """

    index: int
    name: str
    memory_total_bytes: int
    memory_free_bytes: int
    utilisation_pct: float | None = None
    temperature_c: float | None = None
    driver_version: str = ""
    shared_memory: bool = False
    # Live figures read each advert interval (absent from the map when not read):
    memory_used_bytes: int | None = None
    power_draw_w: float | None = None
    power_limit_w: float | None = None
    clock_ratio: float | None = None  # SM clock now / its maximum (1.0: full speed)
    throttle: tuple[str, ...] = ()  # why clocks are held down ("hw_thermal", "sw_power_cap")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "index": self.index,
            "name": self.name[:MAX_TEXT],
            "memory_total_bytes": self.memory_total_bytes,
            "memory_free_bytes": self.memory_free_bytes,
            "utilisation_pct": self.utilisation_pct,
            "temperature_c": self.temperature_c,
            "driver_version": self.driver_version[:MAX_VERSION],
            "shared_memory": self.shared_memory,
        }
        _put(out, "memory_used_bytes", self.memory_used_bytes)
        _put(out, "power_draw_w", self.power_draw_w)
        _put(out, "power_limit_w", self.power_limit_w)
        _put(out, "clock_ratio", self.clock_ratio)
        if self.throttle:
            out["throttle"] = [r[:MAX_GPU_REASON] for r in self.throttle[:MAX_GPU_THROTTLE]]
        return out

    @classmethod
    def from_dict(cls, d: object) -> GpuInfo:
        if not isinstance(d, Mapping):
            raise ProtocolError("hardware gpu entry must be a map")
        return cls(
            index=_int(d, "index"),
            name=_text(d, "name"),
            memory_total_bytes=_int(d, "memory_total_bytes"),
            memory_free_bytes=_int(d, "memory_free_bytes"),
            utilisation_pct=_opt_num(d, "utilisation_pct"),
            temperature_c=_opt_num(d, "temperature_c"),
            driver_version=_text(d, "driver_version", MAX_VERSION),
            shared_memory=_bool(d, "shared_memory"),
            memory_used_bytes=_opt_int(d, "memory_used_bytes"),
            power_draw_w=_opt_num(d, "power_draw_w"),
            power_limit_w=_opt_num(d, "power_limit_w"),
            clock_ratio=_opt_num(d, "clock_ratio"),
            throttle=_texts(d, "throttle", MAX_GPU_THROTTLE, MAX_GPU_REASON),
        )


@dataclass(frozen=True, slots=True)
class Hardware:
    """This node's hardware and its live figures at one reading.

    ``kind`` is ``"nvidia"`` (GPUs through NVML), ``"jetson"`` (an NVIDIA Tegra board read
    through sysfs/tegrastats) or ``"cpu"`` (no GPU found: CPU only, never an error).
    ``thermal_c`` holds (zone type, degrees C) pairs sorted by name. ``notes`` says briefly what
    could not be read (``"nvml: NVML Shared Library Not Found"``), for ``meshd status``.

    Live host figures (docs/telemetry.md): ``cpu_load_1m`` (/proc/loadavg), ``power_w`` (the
    board's input power: a Jetson's VDD_IN rail, or the CPU package through RAPL),
    ``cpu_clock_ratio`` (CPU clock now / its maximum), ``throttle`` (host reasons, e.g.
    ``"thermal:cpu-thermal"``: a zone at or above its passive trip point), ``stale`` (sources
    whose last reading failed: their figures here are the last good ones, and routing treats
    them as unknown), ``kv_memory`` (where the node's models keep their KV cache: ``"gpu"``,
    ``"host"``, or ``""`` when the node did not say).
    """

    kind: str
    cpu_cores: int
    cpu_model: str
    memory_total_bytes: int
    memory_available_bytes: int
    gpus: tuple[GpuInfo, ...] = ()
    thermal_c: tuple[tuple[str, float], ...] = ()
    board: str = ""
    notes: tuple[str, ...] = ()
    cpu_load_1m: float | None = None
    power_w: float | None = None
    cpu_clock_ratio: float | None = None
    throttle: tuple[str, ...] = ()
    stale: tuple[str, ...] = ()
    kv_memory: str = ""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": self.kind,
            "cpu_cores": self.cpu_cores,
            "cpu_model": self.cpu_model[:MAX_TEXT],
            "memory_total_bytes": self.memory_total_bytes,
            "memory_available_bytes": self.memory_available_bytes,
            "gpus": _gpus_within(self.gpus[:MAX_GPUS], GPU_BUDGET_BYTES),
            "thermal_c": {k[:MAX_TEXT]: v for k, v in self.thermal_c[:MAX_THERMAL_ZONES]},
            "board": self.board[:MAX_TEXT],
            "notes": [n[:MAX_TEXT] for n in self.notes[:MAX_NOTES]],
        }
        _put(out, "cpu_load_1m", self.cpu_load_1m)
        _put(out, "power_w", self.power_w)
        _put(out, "cpu_clock_ratio", self.cpu_clock_ratio)
        if self.throttle:
            out["throttle"] = [r[:MAX_REASON] for r in self.throttle[:MAX_THROTTLE]]
        if self.stale:
            out["stale"] = [n[:MAX_TEXT] for n in self.stale[:MAX_STALE]]
        if self.kv_memory:
            out["kv_memory"] = self.kv_memory
        return out

    @classmethod
    def from_dict(cls, d: object) -> Hardware:
        """Read a hardware map from a peer. Raises only ``ProtocolError``."""
        if not isinstance(d, Mapping):
            raise ProtocolError("hardware must be a map")
        kind = _text(d, "kind")
        if kind not in KINDS:
            raise ProtocolError(f"hardware kind must be one of {', '.join(KINDS)}")
        gpus = d.get("gpus", [])
        if not isinstance(gpus, list) or len(gpus) > MAX_GPUS:
            raise ProtocolError(f"hardware gpus must be a list of at most {MAX_GPUS}")
        thermal = d.get("thermal_c", {})
        if not isinstance(thermal, Mapping) or len(thermal) > MAX_THERMAL_ZONES:
            raise ProtocolError("hardware thermal_c must be a small map")
        zones = []
        for k, v in thermal.items():
            if not isinstance(k, str) or len(k) > MAX_TEXT or not _is_num(v):
                raise ProtocolError("hardware thermal_c must map zone names to numbers")
            zones.append((k, float(v)))
        notes = d.get("notes", [])
        if (
            not isinstance(notes, list)
            or len(notes) > MAX_NOTES
            or not all(isinstance(n, str) and len(n) <= MAX_TEXT for n in notes)
        ):
            raise ProtocolError("hardware notes must be a short list of strings")
        return cls(
            kind=kind,
            cpu_cores=_int(d, "cpu_cores"),
            cpu_model=_text(d, "cpu_model"),
            memory_total_bytes=_int(d, "memory_total_bytes"),
            memory_available_bytes=_int(d, "memory_available_bytes"),
            gpus=tuple(GpuInfo.from_dict(g) for g in gpus),
            thermal_c=tuple(sorted(zones)),
            board=_text(d, "board"),
            notes=tuple(notes),
            cpu_load_1m=_opt_num(d, "cpu_load_1m"),
            power_w=_opt_num(d, "power_w"),
            cpu_clock_ratio=_opt_num(d, "cpu_clock_ratio"),
            throttle=_texts(d, "throttle", MAX_THROTTLE, MAX_REASON),
            stale=_texts(d, "stale", MAX_STALE, MAX_TEXT),
            kv_memory=_kv_memory(d),
        )


def _gpus_within(gpus: tuple[GpuInfo, ...], budget: int) -> list[dict[str, Any]]:
    """The GPUs' maps, in order, as many as fit ``budget`` bytes packed."""
    out: list[dict[str, Any]] = []
    for g in gpus:
        d = g.to_dict()
        budget -= len(msgpack.packb(d))
        if budget < 0:
            break
        out.append(d)
    return out


def _put(out: dict[str, Any], key: str, value: float | int | None) -> None:
    if value is not None:
        out[key] = round(value, 3) if isinstance(value, float) else value


def _texts(d: Mapping[Any, Any], key: str, count: int, cap: int) -> tuple[str, ...]:
    v = d.get(key, [])
    if (
        not isinstance(v, list)
        or len(v) > count
        or not all(isinstance(x, str) and len(x) <= cap for x in v)
    ):
        raise ProtocolError(f"hardware {key} must be a short list of short strings")
    return tuple(v)


def _kv_memory(d: Mapping[Any, Any]) -> str:
    v = d.get("kv_memory", "")
    if v not in KV_MEMORY:
        raise ProtocolError("hardware kv_memory must be 'gpu', 'host' or absent")
    return str(v)


def _opt_int(d: Mapping[Any, Any], key: str) -> int | None:
    return None if d.get(key) is None else _int(d, key)


def _is_num(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _int(d: Mapping[Any, Any], key: str) -> int:
    v = d.get(key, 0)
    if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < 1 << 62:
        raise ProtocolError(f"hardware {key} must be a non-negative integer")
    return v


def _opt_num(d: Mapping[Any, Any], key: str) -> float | None:
    v = d.get(key)
    if v is None:
        return None
    if not _is_num(v):
        raise ProtocolError(f"hardware {key} must be a finite number or null")
    return float(v)


def _text(d: Mapping[Any, Any], key: str, cap: int = MAX_TEXT) -> str:
    v = d.get(key, "")
    if not isinstance(v, str) or len(v) > cap:
        raise ProtocolError(f"hardware {key} must be a string of at most {cap} characters")
    return v


def _bool(d: Mapping[Any, Any], key: str) -> bool:
    v = d.get(key, False)
    if not isinstance(v, bool):
        raise ProtocolError(f"hardware {key} must be true or false")
    return v
