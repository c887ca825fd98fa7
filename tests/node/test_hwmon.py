"""The hardware monitor: readings on a worker thread under a deadline; a hung or raising
source is reported once, never stops the node, and is read again next interval."""

from __future__ import annotations

import dataclasses
import logging
import threading

import pytest
import trio

from meshd.node.hwmon import HardwareMonitor, kv_memory_of, read_deadline_s
from meshd.telemetry import Hardware
from meshd.telemetry.report import FailureReport
from meshd.testing.fakes_telemetry import CPU_ONLY, FakeTelemetrySource
from meshd.testing.wait import wait_until


class HangingSource(FakeTelemetrySource):
    """Hangs (a stuck NVML call) while ``hang`` is set; raises while ``boom`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.hang = threading.Event()
        self.release = threading.Event()
        self.boom = False

    def read(self) -> Hardware:
        if self.hang.is_set():
            self.release.wait(10)
        if self.boom:
            raise RuntimeError("sensor exploded")
        return super().read()


def test_deadline():
    assert read_deadline_s(2.0) == 1.0 and read_deadline_s(30.0) == 5.0 and read_deadline_s(0.01) == 0.05


def test_kv_memory_of():
    assert kv_memory_of(["CUDAExecutionProvider"]) == "gpu"
    assert kv_memory_of(["CPUExecutionProvider"]) == kv_memory_of([]) == "host"


def test_readings_reach_the_node_and_failures_are_reported_once(caplog):
    caplog.set_level(logging.INFO)
    source = HangingSource()
    seen: list[Hardware] = []
    mon = HardwareMonitor(source, interval_s=0.05, report=FailureReport(), on_reading=seen.append,
                          kv_memory="host")

    def failed() -> list[str]:
        return [r.getMessage() for r in caplog.records if "hardware reading failed" in r.getMessage()]

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(mon.run)
            await wait_until(lambda: len(seen) >= 2, timeout_s=10)
            assert seen[-1] == dataclasses.replace(CPU_ONLY, kv_memory="host")
            source.hardware = dataclasses.replace(CPU_ONLY, memory_available_bytes=1 << 30)
            await wait_until(lambda: seen[-1].memory_available_bytes == 1 << 30, timeout_s=10)

            source.hang.set()  # hung: abandoned at the deadline, reported once
            await wait_until(lambda: mon.failed_readings >= 3, timeout_s=10)
            assert len(failed()) == 1 and "no reading within 0.05 s" in failed()[0]
            n = len(seen)
            source.hang.clear()
            source.release.set()
            await wait_until(lambda: len(seen) > n, timeout_s=10)  # read again, and it works
            assert mon.report.failing == ()

            source.boom = True  # raising: the same, once
            await wait_until(lambda: mon.failed_readings >= 6, timeout_s=10)
            assert len(failed()) == 2 and "sensor exploded" in failed()[1]
            source.boom = False
            n = len(seen)
            await wait_until(lambda: len(seen) > n, timeout_s=10)
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert sum("reading recovered source=reading" in r.getMessage() for r in caplog.records) == 2
    assert mon.statistics()["readings"] == len(seen)


def test_energy_weight_config_key():
    from meshd.config import parse_config
    from meshd.errors import ConfigError
    from meshd.node.node import policy_of

    assert parse_config({}).routing.energy_weight == 0.0  # off by default
    cfg = parse_config({"routing": {"energy_weight": 150.0}}, "meshd.toml")
    assert policy_of(cfg).energy_weight == 150.0
    with pytest.raises(ConfigError, match=r"meshd.toml: \[routing\] energy_weight must be >= 0"):
        parse_config({"routing": {"energy_weight": -1.0}}, "meshd.toml")
