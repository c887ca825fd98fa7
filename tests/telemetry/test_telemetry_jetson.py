"""A Jetson board read through a fake sysfs tree (NVML absent there)."""

from __future__ import annotations

import pytest

from meshd.telemetry import HostTelemetry, read_hardware
from meshd.telemetry.jetson import is_jetson, l4t_release
from meshd.testing.fakes_telemetry import FakeNvml, build_jetson_tree

NO_NVML = FakeNvml(fail_init=True)
ORIN_LINE = (
    "RAM 2513/7620MB (lfb 1121x4MB) SWAP 0/3810MB (cached 0MB) CPU [1%@729,0%@729] "
    "EMC_FREQ 0%@2133 GR3D_FREQ 61%@[305] CPU@46.25C GPU@41.5C tj@46.25C VDD_IN 4071mW/4071mW"
)


def test_nano_from_sysfs(tmp_path):
    build_jetson_tree(tmp_path)
    hw = read_hardware(root=tmp_path, nvml=NO_NVML)
    assert hw.kind == "jetson"
    assert hw.board == "NVIDIA Jetson Nano Developer Kit"
    assert hw.cpu_model == "ARMv8 Processor rev 1 (v8l)"
    assert hw.memory_total_bytes == 4059712 * 1024
    assert hw.notes == ()  # NVML's absence is normal on a Jetson
    (gpu,) = hw.gpus
    assert gpu.name == "NVIDIA Jetson Nano Developer Kit GPU"
    assert gpu.utilisation_pct == 25.3
    assert gpu.temperature_c == 29.5
    assert gpu.shared_memory
    assert (gpu.memory_total_bytes, gpu.memory_free_bytes) == (4059712 * 1024, 1553324 * 1024)
    assert gpu.driver_version == "L4T R32.7.1"
    assert dict(hw.thermal_c)["CPU-therm"] == 30.5


@pytest.mark.parametrize(
    "load_file",
    [
        "sys/devices/platform/gpu.0/load",
        "sys/devices/platform/17000000.ga10b/load",
        "sys/devices/platform/bus@0/17000000.gpu/load",
    ],
)
def test_other_gpu_load_paths(tmp_path, load_file):
    build_jetson_tree(tmp_path, gpu_load_file=load_file, gpu_load_per_mille=1000)
    assert read_hardware(root=tmp_path, nvml=NO_NVML).gpus[0].utilisation_pct == 100.0


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda r: (r / "etc").mkdir() or (r / "etc/nv_tegra_release").write_text("# R35\n"), True),
        (
            lambda r: (
                (r / "proc/device-tree").mkdir(parents=True)
                or (r / "proc/device-tree/model").write_text("NVIDIA Jetson AGX Orin\x00")
            ),
            True,
        ),
        (lambda r: (r / "sys/devices/gpu.0").mkdir(parents=True), True),
        (lambda r: (r / "sys/devices/platform/gpu.0").mkdir(parents=True), True),
        (
            lambda r: (
                (r / "proc/device-tree").mkdir(parents=True)
                or (r / "proc/device-tree/model").write_text("Raspberry Pi 4 Model B\x00")
            ),
            False,
        ),
        (lambda r: None, False),
    ],
    ids=["release", "dt-model", "gpu.0", "platform-gpu.0", "raspberry", "empty"],
)
def test_detection(tmp_path, make, expected):
    make(tmp_path)
    assert is_jetson(tmp_path) is expected


def test_tegrastats_fills_what_sysfs_lacks(tmp_path):
    build_jetson_tree(
        tmp_path,
        gpu_load_per_mille=None,
        zones={"CPU-therm": 40000},
        model="NVIDIA Jetson AGX Orin Developer Kit",
        release="# R35 (release), REVISION: 4.1, GCID: 33958178, BOARD: t186ref",
    )
    hw = read_hardware(root=tmp_path, nvml=NO_NVML, tegrastats=ORIN_LINE)
    gpu = hw.gpus[0]
    assert (gpu.utilisation_pct, gpu.temperature_c) == (61.0, 41.5)
    assert gpu.driver_version == "L4T R35.4.1"


def test_sysfs_wins_over_tegrastats(tmp_path):
    build_jetson_tree(tmp_path, gpu_load_per_mille=500)
    gpu = read_hardware(root=tmp_path, nvml=NO_NVML, tegrastats=ORIN_LINE).gpus[0]
    assert (gpu.utilisation_pct, gpu.temperature_c) == (50.0, 29.5)


def test_tegrastats_alone_marks_a_jetson(tmp_path):
    source = HostTelemetry(root=tmp_path, nvml=NO_NVML)
    source.feed_tegrastats(ORIN_LINE)
    hw = source.read()
    assert hw.kind == "jetson"
    assert hw.memory_total_bytes == 7620 << 20  # no /proc: the line's RAM figures
    assert hw.gpus[0].memory_free_bytes == (7620 - 2513) << 20
    assert hw.gpus[0].name == "Tegra GPU"


def test_garbage_sysfs_never_crashes(tmp_path):
    build_jetson_tree(tmp_path, zones={"GPU-therm": 0})
    (tmp_path / "sys/devices/gpu.0/load").write_text("n/a\n")
    (tmp_path / "etc/nv_tegra_release").write_bytes(b"\xff\xfe garbage")
    (tmp_path / "proc/meminfo").write_text("MemTotal: lots\n")
    hw = read_hardware(root=tmp_path, nvml=NO_NVML)
    assert hw.kind == "jetson"
    assert hw.gpus[0].utilisation_pct is None
    assert hw.gpus[0].temperature_c == 0.0
    assert l4t_release(tmp_path) == ""


def test_nvml_gpus_win_over_jetson_markers(tmp_path):
    from meshd.testing.fakes_telemetry import FakeGpu

    build_jetson_tree(tmp_path)
    assert read_hardware(root=tmp_path, nvml=FakeNvml(gpus=[FakeGpu()])).kind == "nvidia"
