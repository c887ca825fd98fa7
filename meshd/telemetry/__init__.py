"""Hardware discovery and live figures for adverts and ``meshd status``; never crashes.

``read_hardware()`` gives one ``Hardware`` reading of this host; a node keeps a
``HostTelemetry`` (a ``TelemetrySource``) and reads it each advert interval. ``process_stats()``
gives this process's RSS and CPU seconds. ``parse_tegrastats()`` is a pure parser of one
tegrastats line.
"""

from meshd.telemetry.hardware import GpuInfo, Hardware
from meshd.telemetry.procfs import ProcessStats, process_stats
from meshd.telemetry.source import HostTelemetry, TelemetrySource, read_hardware
from meshd.telemetry.tegrastats import TegraStats, parse_tegrastats

__all__ = [
    "GpuInfo",
    "Hardware",
    "HostTelemetry",
    "ProcessStats",
    "TegraStats",
    "TelemetrySource",
    "parse_tegrastats",
    "process_stats",
    "read_hardware",
]
