"""/proc and /sys readers over fake trees, and process_stats on this process."""

from __future__ import annotations

import os
import platform

import pytest

from meshd.telemetry import ProcessStats, process_stats
from meshd.telemetry.procfs import (
    cpu_model,
    memory_bytes,
    parse_cpu_model,
    parse_meminfo,
    parse_vmrss,
    thermal_zones,
)


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_parse_meminfo_units_and_junk():
    info = parse_meminfo("MemTotal:  1000 kB\nHugePages_Total:  4\nbad line\nX: y kB\n")
    assert info == {"MemTotal": 1024000, "HugePages_Total": 4}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("MemTotal: 100 kB\nMemFree: 10 kB\nMemAvailable: 60 kB\n", (102400, 61440)),
        # kernels before 3.14: free + buffers + page cache
        ("MemTotal: 100 kB\nMemFree: 10 kB\nBuffers: 5 kB\nCached: 20 kB\n", (102400, 35840)),
        ("", (0, 0)),
    ],
)
def test_memory_bytes(tmp_path, text, expected):
    write(tmp_path / "proc/meminfo", text)
    assert memory_bytes(tmp_path) == expected


def test_memory_bytes_without_proc(tmp_path):
    assert memory_bytes(tmp_path) == (0, 0)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) 8375C\n",
            "Intel(R) Xeon(R) 8375C",
        ),
        ("processor\t: 0\nBogoMIPS\t: 38.40\nCPU part\t: 0xd04\n", ""),
        (
            "Processor\t: AArch64 Processor rev 4 (aarch64)\nprocessor\t: 0\n",
            "AArch64 Processor rev 4 (aarch64)",
        ),
        ("processor\t: 0\nHardware\t: BCM2835\n", "BCM2835"),
        ("", ""),
    ],
)
def test_parse_cpu_model(text, expected):
    assert parse_cpu_model(text) == expected


def test_cpu_model_falls_back_to_machine(tmp_path):
    assert cpu_model(tmp_path) == (platform.machine() or "unknown")


def test_thermal_zones_skip_bad_and_name_duplicates(tmp_path):
    zones = [
        ("acpitz", "41000"),
        ("x86_pkg_temp", "55500"),
        ("acpitz", "43000"),
        ("GPU-therm", "-256000"),
        ("broken", "EINVAL"),
        ("", "30000"),
    ]
    for i, (kind, temp) in enumerate(zones):
        write(tmp_path / f"sys/class/thermal/thermal_zone{i}/type", kind + "\n")
        write(tmp_path / f"sys/class/thermal/thermal_zone{i}/temp", temp + "\n")
    write(tmp_path / "sys/class/thermal/cooling_device0/type", "Processor\n")
    assert thermal_zones(tmp_path) == (
        ("acpitz", 41.0),
        ("acpitz.2", 43.0),
        ("thermal_zone5", 30.0),
        ("x86_pkg_temp", 55.5),
    )


def test_thermal_zones_absent(tmp_path):
    assert thermal_zones(tmp_path) == ()


@pytest.mark.parametrize(
    ("text", "expected"),
    [("Name:\tpython\nVmRSS:\t   20480 kB\n", 20971520), ("VmRSS:\n", None), ("Name: x\n", None)],
)
def test_parse_vmrss(text, expected):
    assert parse_vmrss(text) == expected


def test_process_stats_of_this_process():
    s = process_stats()
    assert s.rss_bytes > 1 << 20
    t = os.times()
    assert 0 <= s.cpu_user_s <= t.user and 0 <= s.cpu_system_s <= t.system
    assert set(s.to_dict()) == {"rss_bytes", "cpu_user_s", "cpu_system_s"}


def test_process_stats_from_fake_proc_and_fallback(tmp_path):
    write(tmp_path / "proc/self/status", "VmRSS:\t 1000 kB\n")
    assert process_stats(tmp_path).rss_bytes == 1024000
    assert process_stats(tmp_path / "absent").rss_bytes > 0  # getrusage peak RSS


@pytest.mark.parametrize(
    ("before", "after", "elapsed", "pct"),
    [
        ((1.0, 0.5), (1.5, 0.5), 10.0, 5.0),
        ((1.0, 0.0), (1.0, 0.0), 1.0, 0.0),
        ((1.0, 0.0), (2.0, 0.0), 0.0, 0.0),
        ((2.0, 0.0), (1.0, 0.0), 1.0, 0.0),
    ],
)
def test_cpu_percent_since(before, after, elapsed, pct):
    a = ProcessStats(0, *before)
    b = ProcessStats(0, *after)
    assert b.cpu_percent_since(a, elapsed) == pytest.approx(pct)
