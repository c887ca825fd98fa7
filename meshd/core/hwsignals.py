"""What routing takes from a node's live hardware readings (pure; docs/telemetry.md).

A node's advert carries its hardware map (``meshd.telemetry.Hardware.to_dict``), re-read every
advert interval. ``read_signals`` turns one (a peer's, so anything may be in it; it never
raises) into the three figures routing uses:

* ``free_memory_bytes``: free memory where the node's models keep their KV cache: the first
  GPU's free memory when its models run on a GPU, else the host's available memory (a Jetson's
  GPU shares it). A node whose free memory cannot hold a request's KV cache is not a candidate
  (``kv_tokens_in_memory``).
* ``power_w``: measured power draw: the GPUs' draw (NVML) plus the CPU package's (RAPL), or a
  Jetson's board input rail. With ``[routing] energy_weight`` the router trades predicted TTFT
  for joules per token (``meshd.core.energy``).
* ``throttle`` and ``speed_factor``: why the compute device runs slower than it could (NVML
  throttle reasons, a thermal zone past its passive trip point) and by how much: the measured
  clock ratio (clock now / maximum) when known, else a default per kind of throttling. Predicted
  speeds are multiplied by it (``throttled``).

A figure from a source the node marks ``stale`` (its last reading failed) is unknown: unknown
never excludes a node nor slows it down.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from meshd.core.snapshot import NodeView, Serving

THERMAL_FACTOR = 0.6  # speed kept under thermal throttling when the clock ratio is unknown
POWER_FACTOR = 0.8  # ... under power capping
MIN_FACTOR = 0.1  # a reading never makes a node look more than 10x slower
MAX_REASONS = 8
UNLIMITED_TOKENS = 1 << 30


@dataclass(frozen=True, slots=True)
class HwSignals:
    free_memory_bytes: int | None = None
    power_w: float | None = None
    throttle: tuple[str, ...] = ()
    speed_factor: float = 1.0


NONE = HwSignals()


def _num(v: object) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    f = float(v)
    return f if math.isfinite(f) and f >= 0.0 else None


def _strs(v: object) -> tuple[str, ...]:
    if not isinstance(v, list | tuple):
        return ()
    return tuple(x[:64] for x in v[:MAX_REASONS] if isinstance(x, str))


def speed_factor(throttle: tuple[str, ...], clock_ratio: float | None) -> float:
    """The share of its full speed a device keeps while ``throttle`` holds it down: the measured
    ``clock_ratio`` when known, else ``THERMAL_FACTOR`` or ``POWER_FACTOR`` (the lower of those
    that apply). Never below ``MIN_FACTOR``; 1.0 when nothing throttles."""
    if not throttle:
        return 1.0
    if clock_ratio is not None and 0.0 < clock_ratio <= 1.0:
        return max(MIN_FACTOR, clock_ratio)
    factor = 1.0
    for reason in throttle:
        factor = min(factor, POWER_FACTOR if "power" in reason else THERMAL_FACTOR)
    return factor


def read_signals(hw: Mapping[str, Any] | object) -> HwSignals:
    """The routing signals of one hardware map (see the module docstring). Never raises."""
    if not isinstance(hw, Mapping) or not hw:
        return NONE
    stale = set(_strs(hw.get("stale")))
    raw = hw.get("gpus")
    gpus = [g for g in raw if isinstance(g, Mapping)] if isinstance(raw, list) else []
    gpu_ok = "nvml" not in stale and "telemetry" not in stale
    host_ok = "procfs" not in stale and "telemetry" not in stale
    dedicated = [g for g in gpus if g.get("shared_memory") is not True]
    kv = hw.get("kv_memory")
    on_gpu = bool(dedicated) and kv != "host"
    free: float | None = None
    if on_gpu and gpu_ok:
        free = _num(dedicated[0].get("memory_free_bytes"))
    elif not on_gpu and host_ok:
        free = _num(hw.get("memory_available_bytes"))
        free = free if free else None  # 0: not read
    power: float | None = None
    if gpu_ok:
        draws = [d for g in dedicated if (d := _num(g.get("power_draw_w"))) is not None]
        power = sum(draws) if draws else None
    board = _num(hw.get("power_w")) if "telemetry" not in stale else None
    if board is not None:
        power = board if power is None else power + board
    host = _strs(hw.get("throttle")) if host_ok else ()
    gpu = _strs(dedicated[0].get("throttle")) if dedicated and gpu_ok else ()
    # what slows the device the models run on: the first GPU's reasons, or the host's
    device, ratio = host, _num(hw.get("cpu_clock_ratio"))
    if on_gpu:
        device = gpu
        ratio = _num(dedicated[0].get("clock_ratio")) if gpu_ok else None
    throttle = device + tuple(r for r in gpu + host if r not in device)
    return HwSignals(
        free_memory_bytes=int(free) if free is not None else None,
        power_w=round(power, 3) if power is not None else None,
        throttle=throttle[:MAX_REASONS],
        speed_factor=speed_factor(device, ratio),
    )


def reserve_host_memory(hw: Mapping[str, Any], reserved_bytes: int) -> Mapping[str, Any]:
    """The hardware map a node advertises once ``reserved_bytes`` of its host memory are
    promised to something that does not hold them yet: its KV prefix caches' budgets less what
    they hold (what they hold is already gone from the reading). The prefix cache keeps its
    blocks in host memory, so the host's available memory (a CPU node's, or a Jetson's, KV
    memory) goes down by it; a dedicated GPU's free memory does not. The map as it was when
    nothing is reserved or the host's memory was not read."""
    free = hw.get("memory_available_bytes")
    if reserved_bytes <= 0 or isinstance(free, bool) or not isinstance(free, int) or not free:
        return hw
    return {**hw, "memory_available_bytes": max(1, free - reserved_bytes)}


def kv_tokens_in_memory(free_memory_bytes: int | None, kv_bytes_per_token: int) -> int:
    """Tokens of KV cache that fit in ``free_memory_bytes`` (unlimited when either is unknown)."""
    if free_memory_bytes is None or kv_bytes_per_token <= 0:
        return UNLIMITED_TOKENS
    return min(UNLIMITED_TOKENS, max(0, free_memory_bytes) // kv_bytes_per_token)


def throttled(serving: Serving, factor: float) -> Serving:
    """A serving entry whose measured per-layer times are those of a device at ``factor`` of
    its speed."""
    if factor >= 1.0:
        return serving
    return dataclasses.replace(
        serving,
        prefill_ms_per_layer_token=serving.prefill_ms_per_layer_token / factor,
        decode_ms_per_layer=serving.decode_ms_per_layer / factor,
    )


def with_signals(view: NodeView, sig: HwSignals) -> NodeView:
    """``view`` as routing should see it given ``sig``: its speeds (per request, per layer and
    its measured service rate) scaled by the speed factor, and the signals attached. The daemon
    (``meshd.node.view``) and the simulator (``meshd.sim.views``) both build views with this."""
    f = sig.speed_factor
    if sig is NONE:
        return view
    if f >= 1.0:
        return dataclasses.replace(view, free_memory_bytes=sig.free_memory_bytes,
                                   power_w=sig.power_w, throttle=sig.throttle)
    return dataclasses.replace(
        view,
        prefill_tps=view.prefill_tps * f,
        decode_tps=view.decode_tps * f,
        service_rate_rps=view.service_rate_rps * f,
        serving=tuple(throttled(s, f) for s in view.serving),
        free_memory_bytes=sig.free_memory_bytes,
        power_w=sig.power_w,
        throttle=sig.throttle,
        speed_factor=f,
    )
