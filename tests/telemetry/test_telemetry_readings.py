"""Live readings: each read sees what the host (a fake /proc, /sys and NVML) says now; a source
that fails is reported once, keeps its last good figures marked stale, and is read again."""

from __future__ import annotations

import logging

import msgpack

from meshd.telemetry import Hardware, HostTelemetry
from meshd.telemetry.nvml import NvmlGpus, throttle_reasons
from meshd.telemetry.procfs import parse_loadavg
from meshd.testing.fakes_telemetry import FakeGpu, FakeNvml, build_host_tree


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def failures(caplog, source: str) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if "hardware reading failed" in r.getMessage() and f"source={source}" in r.getMessage()]


def test_host_figures_change_between_reads(tmp_path):
    clock = Clock()
    build_host_tree(tmp_path, mem_available_kb=8 << 20, load_1m=0.5, rapl_uj=1_000_000,
                    zones={"x86_pkg_temp": (50_000, 95_000)})
    source = HostTelemetry(root=tmp_path, nvml=FakeNvml(), clock=clock)
    first = source.read()
    assert first.kind == "cpu" and first.memory_available_bytes == 8 << 30
    assert first.cpu_load_1m == 0.5 and first.cpu_clock_ratio == 0.8
    assert first.power_w is None  # RAPL needs two readings
    assert first.throttle == () and first.stale == ()

    clock.t += 2.0
    build_host_tree(tmp_path, mem_available_kb=1 << 20, load_1m=3.25, rapl_uj=91_000_000,
                    zones={"x86_pkg_temp": (96_000, 95_000)}, cpu_mhz=(1_200_000, 3_000_000))
    second = source.read()
    assert second.memory_available_bytes == 1 << 30
    assert second.cpu_load_1m == 3.25
    assert second.power_w == 45.0  # 90 J in 2 s
    assert second.throttle == ("thermal:x86_pkg_temp",)  # past its passive trip point
    assert second.cpu_clock_ratio == 0.4
    assert Hardware.from_dict(msgpack.unpackb(msgpack.packb(second.to_dict()))) == second


def test_rapl_counter_wrap(tmp_path):
    clock = Clock()
    build_host_tree(tmp_path, rapl_uj=(1 << 32) - 1_000_000)
    source = HostTelemetry(root=tmp_path, nvml=FakeNvml(), clock=clock)
    source.read()
    clock.t += 1.0
    build_host_tree(tmp_path, rapl_uj=9_000_000)
    assert source.read().power_w == 10.0


def test_nvml_live_figures(tmp_path):
    build_host_tree(tmp_path)
    gpu = FakeGpu(memory_free_bytes=20 << 30, power_mw=72_500, power_limit_mw=300_000)
    fake = FakeNvml(gpus=[gpu])
    source = HostTelemetry(root=tmp_path, nvml=fake)
    g = source.read().gpus[0]
    assert (g.memory_free_bytes, g.memory_used_bytes) == (20 << 30, 4 << 30)
    assert (g.power_draw_w, g.power_limit_w, g.clock_ratio, g.throttle) == (72.5, 300.0, 1.0, ())
    gpu.memory_free_bytes, gpu.power_mw = 1 << 30, 290_000
    gpu.sm_clock_mhz, gpu.throttle_mask = 990, 0x40 | 0x4 | 0x1  # idle bit is not a slowdown
    g = source.read().gpus[0]
    assert g.memory_free_bytes == 1 << 30 and g.power_draw_w == 290.0
    assert g.clock_ratio == 0.5 and g.throttle == ("sw_power_cap", "hw_thermal")


def test_throttle_reason_bits():
    assert throttle_reasons(0) == ()
    assert throttle_reasons(0x1 | 0x2 | 0x10 | 0x100) == ()
    assert throttle_reasons(0xFF) == ("sw_power_cap", "hw_slowdown", "sw_thermal", "hw_thermal",
                                      "hw_power_brake")


def test_a_failing_nvml_reading_is_reported_once_and_retried(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    build_host_tree(tmp_path)
    gpu = FakeGpu(memory_free_bytes=20 << 30)
    fake = FakeNvml(gpus=[gpu])
    source = HostTelemetry(root=tmp_path, nvml=fake)
    assert source.read().stale == ()
    fake.fail = {"nvmlDeviceGetCount": {-1}}
    for _ in range(5):
        hw = source.read()
        assert hw.kind == "nvidia" and hw.stale == ("nvml",)  # the last good GPUs, marked stale
        assert hw.gpus[0].memory_free_bytes == 20 << 30
    assert len(failures(caplog, "nvml")) == 1
    fake.fail = {}
    gpu.memory_free_bytes = 3 << 30
    hw = source.read()
    assert hw.stale == () and hw.gpus[0].memory_free_bytes == 3 << 30  # retried, and read
    assert any("hardware reading recovered source=nvml failures=5" in r.getMessage()
               for r in caplog.records)
    fake.fail = {"nvmlDeviceGetMemoryInfo": {0}}
    source.read()
    assert len(failures(caplog, "nvml")) == 2  # a new failure after recovery is reported again
    assert fake.init_calls == 1


def test_a_failing_meminfo_is_reported_once(tmp_path, caplog):
    build_host_tree(tmp_path, mem_available_kb=5 << 20)
    source = HostTelemetry(root=tmp_path, nvml=FakeNvml())
    source.read()
    (tmp_path / "proc/meminfo").unlink()
    for _ in range(3):
        hw = source.read()
        assert hw.stale == ("procfs",) and hw.memory_available_bytes == 5 << 30
    assert len(failures(caplog, "procfs")) == 1


def test_nvml_that_cannot_start_is_tried_again_with_backoff():
    fake = FakeNvml(gpus=[FakeGpu()], fail_init=True)
    gpus = NvmlGpus(fake)
    tried_at = []
    for read in range(1, 40):
        before = fake.init_calls
        assert gpus.read() == ()
        if fake.init_calls > before:
            tried_at.append(read)
        assert gpus.error == ""  # absence, not a failure to report
    assert tried_at == [1, 3, 6, 11, 20, 37]  # gaps of 1, 2, 4, 8, 16 reads
    fake.fail_init = False
    while not gpus.read():
        pass
    assert fake.init_calls == 7


def test_parse_loadavg():
    assert parse_loadavg("0.52 0.58 0.59 2/1261 99\n") == 0.52
    assert parse_loadavg("") is None and parse_loadavg("x y") is None
