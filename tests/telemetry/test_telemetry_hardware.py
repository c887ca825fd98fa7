"""The Hardware record: msgpack-friendly, capped, and read back from peers safely."""

from __future__ import annotations

import contextlib

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshd.errors import ProtocolError
from meshd.telemetry import GpuInfo, Hardware, TelemetrySource, read_hardware
from meshd.testing.fakes_telemetry import CPU_ONLY, FakeTelemetrySource

GPU = GpuInfo(0, "NVIDIA L4", 24 << 30, 4 << 30, 97.0, None, "550.54.15")
NVIDIA = Hardware("nvidia", 16, "AMD EPYC", 64 << 30, 40 << 30, (GPU,), (("acpitz", 41.0),))


def test_round_trip_through_msgpack():
    d = NVIDIA.to_dict()
    assert Hardware.from_dict(msgpack.unpackb(msgpack.packb(d))) == NVIDIA
    assert d["gpus"][0]["temperature_c"] is None
    assert d["thermal_c"] == {"acpitz": 41.0}


def test_to_dict_is_capped():
    many = Hardware(
        "nvidia",
        1,
        "x" * 500,
        0,
        0,
        gpus=tuple(GpuInfo(i, "n" * 500, 1 << 40, 1 << 40, 100.0, 100.0, "v" * 99, False,
                           1 << 40, 1234.567, 1234.567, 0.123, ("hw_power_brake" * 3,) * 9)
                   for i in range(40)),
        thermal_c=tuple((f"zone{i}", 1.0) for i in range(40)),
        notes=tuple("note" * 100 for _ in range(10)),
        cpu_load_1m=123.456, power_w=1234.567, cpu_clock_ratio=0.5,
        throttle=tuple("thermal:" + "z" * 100 for _ in range(9)),
        stale=tuple("s" * 100 for _ in range(20)), kv_memory="gpu",
    )
    packed = msgpack.packb(many.to_dict())
    assert len(packed) < 5120  # the worst case still leaves half of an 8 KiB advert
    Hardware.from_dict(msgpack.unpackb(packed))


def test_this_host_reading_fits_an_advert():
    hw = read_hardware()
    assert hw.kind in {"cpu", "nvidia", "jetson"} and hw.cpu_cores >= 1
    assert len(msgpack.packb(hw.to_dict())) < 4096


@pytest.mark.parametrize(
    "bad",
    [
        None,
        [],
        {"kind": "tpu"},
        {"kind": "cpu", "cpu_cores": -1},
        {"kind": "cpu", "cpu_cores": True},
        {"kind": "cpu", "gpus": {}},
        {"kind": "cpu", "gpus": [1]},
        {"kind": "cpu", "gpus": [{"utilisation_pct": float("nan")}]},
        {"kind": "cpu", "gpus": [{"shared_memory": 1}]},
        {"kind": "cpu", "thermal_c": {"a": "hot"}},
        {"kind": "cpu", "notes": [1]},
        {"kind": "cpu", "board": "b" * 1000},
        {"kind": "cpu", "memory_total_bytes": 1 << 70},
    ],
)
def test_from_dict_rejects_garbage(bad):
    with pytest.raises(ProtocolError):
        Hardware.from_dict(bad)


@settings(max_examples=100, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
        lambda inner: (
            st.lists(inner, max_size=3)
            | st.dictionaries(
                st.sampled_from(sorted(NVIDIA.to_dict()) + ["index", "name"]), inner, max_size=6
            )
        ),
        max_leaves=20,
    )
)
def test_from_dict_raises_only_protocol_error(value):
    with contextlib.suppress(ProtocolError):
        Hardware.from_dict(value)


def test_fake_source():
    source: TelemetrySource = FakeTelemetrySource()
    assert source.read() is CPU_ONLY
    source.close()
