"""GPUs through NVML, with a fake pynvml: present, absent, failing part way."""

from __future__ import annotations

import sys

import msgpack
import pytest

from meshd.telemetry import Hardware, HostTelemetry, read_hardware
from meshd.telemetry.nvml import USED_NAMES, NvmlGpus
from meshd.testing.fakes_telemetry import FakeGpu, FakeNvml

TWO = [
    FakeGpu("NVIDIA A2", 16 << 30, 15 << 30, 12, 40),
    FakeGpu("NVIDIA L4", 24 << 30, 4 << 30, 97, 71),
]


def test_fake_has_the_real_pynvml_names():
    pynvml = pytest.importorskip("pynvml")
    for name in USED_NAMES:
        assert hasattr(pynvml, name), name
        assert hasattr(FakeNvml, name), name


def test_two_gpus(tmp_path):
    fake = FakeNvml(gpus=list(TWO))
    hw = read_hardware(root=tmp_path, nvml=fake)
    assert hw.kind == "nvidia"
    assert [g.name for g in hw.gpus] == ["NVIDIA A2", "NVIDIA L4"]
    l4 = hw.gpus[1]
    assert (l4.index, l4.memory_total_bytes, l4.memory_free_bytes) == (1, 24 << 30, 4 << 30)
    assert (l4.utilisation_pct, l4.temperature_c) == (97.0, 71.0)
    assert l4.driver_version == "550.54.15" and not l4.shared_memory
    assert hw.notes == ()
    assert (fake.init_calls, fake.shutdown_calls) == (1, 1)
    assert Hardware.from_dict(msgpack.unpackb(msgpack.packb(hw.to_dict()))) == hw


def test_default_imports_pynvml_module(tmp_path, monkeypatch):
    fake = FakeNvml(gpus=[TWO[0]])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    hw = read_hardware(root=tmp_path)
    assert hw.kind == "nvidia" and len(hw.gpus) == 1


def test_pynvml_not_installed(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import raises ImportError
    hw = read_hardware(root=tmp_path)
    assert hw.kind == "cpu" and hw.gpus == ()
    assert hw.notes == ("nvml: pynvml not installed",)


def test_init_failure_means_cpu_only(tmp_path):
    fake = FakeNvml(gpus=list(TWO), fail_init=True)
    hw = read_hardware(root=tmp_path, nvml=fake)
    assert hw.kind == "cpu" and hw.gpus == ()
    assert hw.notes == ("nvml: NVML Shared Library Not Found",)
    assert fake.shutdown_calls == 0  # never shut down what never started


@pytest.mark.parametrize(
    ("fail", "names", "util", "temp", "note"),
    [
        ({"nvmlDeviceGetMemoryInfo": {1}}, ["NVIDIA A2"], 12.0, 40.0, "gpu 1"),
        ({"nvmlDeviceGetHandleByIndex": {0}}, ["NVIDIA L4"], 97.0, 71.0, "gpu 0"),
        ({"nvmlDeviceGetName": {0}}, ["NVIDIA L4"], 97.0, 71.0, "gpu 0"),
        ({"nvmlDeviceGetUtilizationRates": {0, 1}}, ["NVIDIA A2", "NVIDIA L4"], None, 71.0, ""),
        ({"nvmlDeviceGetTemperature": {1}}, ["NVIDIA A2", "NVIDIA L4"], 97.0, None, ""),
        ({"nvmlSystemGetDriverVersion": {-1}}, ["NVIDIA A2", "NVIDIA L4"], 97.0, 71.0, ""),
    ],
)
def test_a_query_failing_part_way(tmp_path, fail, names, util, temp, note):
    hw = read_hardware(root=tmp_path, nvml=FakeNvml(gpus=list(TWO), fail=fail))
    assert hw.kind == "nvidia"
    assert [g.name for g in hw.gpus] == names
    last = hw.gpus[-1]
    assert (last.utilisation_pct, last.temperature_c) == (util, temp)
    assert (note in hw.notes[0]) if note else hw.notes == ()


def test_count_failing_means_no_gpus(tmp_path):
    hw = read_hardware(
        root=tmp_path, nvml=FakeNvml(gpus=list(TWO), fail={"nvmlDeviceGetCount": {-1}})
    )
    assert hw.kind == "cpu" and hw.gpus == ()
    assert hw.notes[0].startswith("nvml: device count")


def test_zero_gpus_is_cpu(tmp_path):
    assert read_hardware(root=tmp_path, nvml=FakeNvml()).kind == "cpu"


def test_long_lived_source_inits_once_and_sees_live_figures(tmp_path):
    fake = FakeNvml(gpus=[FakeGpu(utilisation_pct=5)])
    source = HostTelemetry(root=tmp_path, nvml=fake)
    assert source.read().gpus[0].utilisation_pct == 5.0
    fake.gpus[0].utilisation_pct = 80
    assert source.read().gpus[0].utilisation_pct == 80.0
    source.close()
    assert (fake.init_calls, fake.shutdown_calls) == (1, 1)
    assert source.read().gpus == ()  # closed: NVML is not restarted behind our back


def test_nvml_gpus_decodes_bytes_and_str_names():
    class StrNames(FakeNvml):
        def nvmlDeviceGetName(self, handle):
            return self.gpus[handle].name

    assert NvmlGpus(StrNames(gpus=[TWO[0]])).read()[0].name == "NVIDIA A2"
    assert NvmlGpus(FakeNvml(gpus=[TWO[0]])).read()[0].name == "NVIDIA A2"


def test_unexpected_failure_still_gives_a_reading(tmp_path, monkeypatch):
    source = HostTelemetry(root=tmp_path, nvml=FakeNvml())

    def boom(root):
        raise RuntimeError("odd host")

    monkeypatch.setattr("meshd.telemetry.source.thermal_state", boom)
    hw = source.read()
    assert hw.kind == "cpu" and hw.notes == ("telemetry: RuntimeError",)
