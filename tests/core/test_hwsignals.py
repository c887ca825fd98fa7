"""What routing reads of a node's hardware map: table tests, and garbage never raises."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshd.core.energy import energy_terms_ms, joules_per_token, per_1k_tokens, request_energy_j
from meshd.core.hwsignals import (
    MIN_FACTOR,
    POWER_FACTOR,
    THERMAL_FACTOR,
    UNLIMITED_TOKENS,
    HwSignals,
    kv_tokens_in_memory,
    read_signals,
    reserve_host_memory,
    speed_factor,
    with_signals,
)
from meshd.core.snapshot import NodeView, Serving

GIB = 1 << 30


def gpu(**kw):
    return {"index": 0, "name": "L4", "memory_total_bytes": 24 * GIB, "memory_free_bytes": 20 * GIB,
            "power_draw_w": 70.0, "clock_ratio": 1.0, **kw}


def host(**kw):
    return {"kind": "cpu", "cpu_cores": 8, "memory_total_bytes": 64 * GIB,
            "memory_available_bytes": 40 * GIB, **kw}


@pytest.mark.parametrize(("hw", "free", "power", "throttle", "factor"), [
    ({}, None, None, (), 1.0),
    (host(), 40 * GIB, None, (), 1.0),
    (host(power_w=65.0), 40 * GIB, 65.0, (), 1.0),
    (host(memory_available_bytes=0), None, None, (), 1.0),  # 0: not read
    # CPU host past a passive trip point: its measured CPU clock ratio
    (host(throttle=["thermal:x86_pkg_temp"], cpu_clock_ratio=0.4), 40 * GIB, None,
     ("thermal:x86_pkg_temp",), 0.4),
    (host(throttle=["thermal:x86_pkg_temp"]), 40 * GIB, None, ("thermal:x86_pkg_temp",),
     THERMAL_FACTOR),
    # a GPU node: the first GPU's free memory, GPUs' power plus RAPL's
    (host(kind="nvidia", gpus=[gpu(), gpu(index=1, power_draw_w=30.0)], power_w=40.0),
     20 * GIB, 140.0, (), 1.0),
    (host(kind="nvidia", gpus=[gpu(throttle=["hw_thermal"], clock_ratio=0.5)]), 20 * GIB, 70.0,
     ("hw_thermal",), 0.5),
    (host(kind="nvidia", gpus=[gpu(throttle=["sw_power_cap"], clock_ratio=None)]), 20 * GIB, 70.0,
     ("sw_power_cap",), POWER_FACTOR),
    # a GPU's throttling does not slow models that run on the CPU, and the reverse
    (host(kind="nvidia", kv_memory="host", gpus=[gpu(throttle=["hw_thermal"], clock_ratio=0.5)]),
     40 * GIB, 70.0, ("hw_thermal",), 1.0),
    (host(kind="nvidia", gpus=[gpu(clock_ratio=0.1)], throttle=["thermal:cpu"], cpu_clock_ratio=0.5),
     20 * GIB, 70.0, ("thermal:cpu",), 1.0),
    # a Jetson: shared memory, the board's input power
    (host(kind="jetson", gpus=[gpu(shared_memory=True, power_draw_w=None)], power_w=9.5),
     40 * GIB, 9.5, (), 1.0),
    # stale sources are unknown: no exclusion, no slowdown
    (host(kind="nvidia", gpus=[gpu(memory_free_bytes=0, throttle=["hw_thermal"])], stale=["nvml"]),
     None, None, (), 1.0),
    (host(stale=["procfs"], throttle=["thermal:x"]), None, None, (), 1.0),
])
def test_read_signals(hw, free, power, throttle, factor):
    sig = read_signals(hw)
    assert (sig.free_memory_bytes, sig.power_w, sig.throttle) == (free, power, throttle)
    assert sig.speed_factor == pytest.approx(factor)


@pytest.mark.parametrize(("throttle", "ratio", "expected"), [
    ((), 0.2, 1.0),
    (("hw_thermal",), None, THERMAL_FACTOR),
    (("hw_power_brake",), None, POWER_FACTOR),
    (("sw_power_cap", "hw_thermal"), None, THERMAL_FACTOR),
    (("hw_thermal",), 0.75, 0.75),
    (("hw_thermal",), 0.01, MIN_FACTOR),
    (("hw_thermal",), 0.0, THERMAL_FACTOR),  # not a usable ratio
])
def test_speed_factor(throttle, ratio, expected):
    assert speed_factor(throttle, ratio) == expected


@pytest.mark.parametrize(("free", "per_token", "tokens"), [
    (None, 4608, UNLIMITED_TOKENS), (1 << 20, 0, UNLIMITED_TOKENS), (16 << 10, 4608, 3),
    (0, 4608, 0), (-5, 10, 0), (1 << 62, 1, UNLIMITED_TOKENS),
])
def test_kv_tokens_in_memory(free, per_token, tokens):
    assert kv_tokens_in_memory(free, per_token) == tokens


def test_with_signals_slows_every_speed_by_the_factor():
    v = NodeView("p", "n", prefill_tps=1000.0, decode_tps=50.0, service_rate_rps=2.0,
                 serving=(Serving("m", 4, 0, 4, 0.5, 2.0, 4608),))
    slow = with_signals(v, HwSignals(free_memory_bytes=GIB, power_w=80.0, throttle=("hw_thermal",),
                                     speed_factor=0.5))
    assert (slow.prefill_tps, slow.decode_tps, slow.service_rate_rps) == (500.0, 25.0, 1.0)
    assert slow.serving[0].prefill_ms_per_layer_token == 1.0 and slow.serving[0].decode_ms_per_layer == 4.0
    assert (slow.free_memory_bytes, slow.power_w, slow.speed_factor) == (GIB, 80.0, 0.5)
    same = with_signals(v, HwSignals(power_w=80.0))
    assert same.decode_tps == 50.0 and same.power_w == 80.0 and same.speed_factor == 1.0
    assert with_signals(v, read_signals({})) is v


@settings(max_examples=200, deadline=None)
@given(st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["kind", "gpus", "memory_available_bytes", "memory_free_bytes", "power_w",
                         "power_draw_w", "throttle", "stale", "kv_memory", "shared_memory",
                         "clock_ratio", "cpu_clock_ratio"]), inner, max_size=6),
    max_leaves=20))
def test_read_signals_never_raises(hw):
    sig = read_signals(hw)
    assert 0.0 < sig.speed_factor <= 1.0
    assert sig.power_w is None or math.isfinite(sig.power_w)


@pytest.mark.parametrize(("power", "service_ms", "slots", "joules"), [
    (None, 1000.0, 1, None), (100.0, 1000.0, 1, 100.0), (100.0, 1000.0, 4, 25.0),
    (300.0, 500.0, 0, 150.0), (-1.0, 10.0, 1, None), (float("inf"), 10.0, 1, None),
])
def test_request_energy(power, service_ms, slots, joules):
    assert request_energy_j(power, service_ms, slots) == joules


def test_energy_per_token_and_terms():
    assert joules_per_token(100.0, 2000.0, 2, 50) == 2.0
    assert joules_per_token(None, 2000.0, 2, 50) is None
    assert per_1k_tokens(30.0, 3000) == 10.0 and math.isnan(per_1k_tokens(1.0, 0))
    assert energy_terms_ms([2.0, 0.5, None], 100.0) == [150.0, 0.0, 150.0]  # unknown: the worst
    assert energy_terms_ms([2.0, 0.5], 0.0) == [0.0, 0.0]
    assert energy_terms_ms([None, None], 50.0) == [0.0, 0.0]



@pytest.mark.parametrize(("hw", "reserved", "free"), [
    (host(), 0, 40 * GIB),  # nothing reserved: the reading as it was
    (host(), 256 << 20, 40 * GIB - (256 << 20)),  # a prefix cache's unused budget is not free
    (host(memory_available_bytes=GIB), 4 * GIB, 1),  # never below 1 (0 reads as "not read")
    (host(memory_available_bytes=0), GIB, None),  # host memory not read: nothing to take from
    ({**host(), "kv_memory": "gpu", "gpus": [gpu()]}, 4 * GIB, 20 * GIB),  # GPU KV: host only
])
def test_a_reserved_prefix_cache_budget_is_not_advertised_as_free(hw, reserved, free) -> None:
    out = reserve_host_memory(hw, reserved)
    assert read_signals(out).free_memory_bytes == free
    assert hw == reserve_host_memory(hw, 0)  # the input map is never changed
    if out is not hw:
        assert out["memory_total_bytes"] == hw["memory_total_bytes"]
