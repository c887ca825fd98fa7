"""parse_tegrastats: table tests on lines in the formats of several L4T releases."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshd.telemetry import TegraStats, parse_tegrastats

NANO = (
    "RAM 2448/3964MB (lfb 1x2MB) SWAP 0/1982MB (cached 0MB) IRAM 0/252kB(lfb 252kB) "
    "CPU [11%@102,9%@102,8%@102,8%@102] EMC_FREQ 0% GR3D_FREQ 0% PLL@28.5C CPU@30.5C "
    "PMIC@100C GPU@29.5C AO@37C thermal@29.75C POM_5V_IN 1942/1942 POM_5V_GPU 0/0 "
    "POM_5V_CPU 318/318"
)
TX2 = (
    "RAM 1880/7854MB (lfb 1049x4MB) SWAP 0/3927MB (cached 0MB) "
    "CPU [1%@345,off,off,0%@345,1%@345,0%@345] EMC_FREQ 0%@1866 GR3D_FREQ 12%@114 APE 150 "
    "PLL@38C MCPU@38C PMIC@100C Tboard@33C GPU@36C BCPU@38C thermal@37.3C Tdiode@35.25C"
)
XAVIER = (
    "RAM 3021/31927MB (lfb 6282x4MB) SWAP 0/15963MB (cached 0MB) "
    "CPU [2%@1190,0%@1190,1%@1190,0%@1190,off,off,off,off] EMC_FREQ 0%@2133 "
    "GR3D_FREQ 99%@1377 APE 150 MTS fg 0% bg 0% AO@34.5C GPU@34.5C Tdiode@37.5C PMIC@100C "
    "AUX@34C CPU@35.5C thermal@34.8C Tboard@35C GPU 0/0 CPU 620/620 SOC 1240/1240 CV 0/0 "
    "VDDRQ 310/310 SYS5V 1560/1560"
)
ORIN = (
    "04-29-2024 10:21:48 RAM 2513/7620MB (lfb 1121x4MB) SWAP 0/3810MB (cached 0MB) "
    "CPU [1%@729,0%@729,0%@729,0%@729,0%@729,0%@729] EMC_FREQ 0%@2133 GR3D_FREQ 45%@[305] "
    "VIC_FREQ 729 APE 200 CV0@-256C CPU@46.25C SOC2@44.343C SOC0@45.031C CV1@-256C "
    "GPU@-256C tj@46.25C SOC1@44.468C CV2@-256C VDD_IN 4071mW/4071mW "
    "VDD_CPU_GPU_CV 480mW/480mW VDD_SOC 1280mW/1280mW"
)


@pytest.mark.parametrize(
    ("line", "ram", "swap", "cores", "gpu_load", "gpu_freq", "gpu_temp", "rail"),
    [
        (NANO, (2448, 3964), (0, 1982), 4, 0.0, None, 29.5, ("POM_5V_IN", 1942)),
        (TX2, (1880, 7854), (0, 3927), 6, 12.0, 114, 36.0, None),
        (XAVIER, (3021, 31927), (0, 15963), 8, 99.0, 1377, 34.5, ("SOC", 1240)),
        (ORIN, (2513, 7620), (0, 3810), 6, 45.0, 305, None, ("VDD_IN", 4071)),
    ],
    ids=["nano", "tx2", "xavier", "orin"],
)
def test_parses_each_release_format(line, ram, swap, cores, gpu_load, gpu_freq, gpu_temp, rail):
    s = parse_tegrastats(line)
    assert (s.ram_used_mb, s.ram_total_mb) == ram
    assert (s.swap_used_mb, s.swap_total_mb) == swap
    assert len(s.cpu_load_pct) == cores == len(s.cpu_freq_mhz)
    assert s.gpu_load_pct == gpu_load
    assert s.gpu_freq_mhz == gpu_freq
    assert s.gpu_temperature_c == gpu_temp
    if rail is not None:
        assert rail in s.power_mw
    names = {name for name, _ in s.power_mw}
    assert not names & {"RAM", "SWAP", "IRAM"}


def test_nano_details():
    s = parse_tegrastats(NANO)
    assert s.cpu_load_pct == (11.0, 9.0, 8.0, 8.0)
    assert s.cpu_freq_mhz == (102, 102, 102, 102)
    assert s.emc_load_pct == 0.0
    assert s.temperature_c("thermal") == 29.75
    assert s.temperature_c("cpu") == 30.5
    assert dict(s.power_mw) == {"POM_5V_IN": 1942, "POM_5V_GPU": 0, "POM_5V_CPU": 318}


def test_off_cores_and_off_sensors():
    tx2 = parse_tegrastats(TX2)
    assert tx2.cpu_load_pct == (1.0, None, None, 0.0, 1.0, 0.0)
    assert tx2.cpu_freq_mhz[1] is None
    orin = parse_tegrastats(ORIN)
    names = [name for name, _ in orin.temperatures_c]
    assert "GPU" not in names and "CV0" not in names  # -256C: sensor powered off
    assert orin.temperature_c("tj") == 46.25


@pytest.mark.parametrize("line", ["", "garbage", "RAM x/yMB GR3D_FREQ %", "CPU [", "GPU@C"])
def test_unparseable_lines_give_empty_figures(line):
    assert parse_tegrastats(line) == TegraStats()


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.sampled_from(list(NANO + ORIN + "[]@%/,-\x00é")), max_size=300))
def test_never_raises(line):
    s = parse_tegrastats(line)
    assert isinstance(s, TegraStats)
