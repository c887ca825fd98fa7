"""systemd/meshd.service: the settings meshd relies on, and systemd's own check of the file."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from meshd.exitcodes import Exit

SYSTEMD = Path(__file__).resolve().parent.parent / "systemd"
UNIT = SYSTEMD / "meshd.service"
GPU_DROP_IN = SYSTEMD / "meshd.service.d" / "gpu.conf"


def parse_unit(text: str) -> dict[str, list[tuple[str, str]]]:
    """Sections of a unit file as ordered (key, value) lists: keys may repeat, as in systemd.
    Comments (# and ;) are skipped and a trailing backslash continues a line."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] | None = None
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line[0] in "#;"):
            continue
        line = f"{pending} {line}".strip() if pending else line
        if line.endswith("\\"):
            pending = line[:-1].strip()
            continue
        pending = ""
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], [])
            continue
        key, sep, value = line.partition("=")
        assert sep and current is not None, f"not a unit file line: {raw!r}"
        current.append((key.strip(), value.strip()))
    return sections


def values(unit: dict[str, list[tuple[str, str]]], section: str, key: str) -> list[str]:
    return [v for k, v in unit.get(section, []) if k == key]


def one(unit: dict[str, list[tuple[str, str]]], section: str, key: str) -> str:
    found = values(unit, section, key)
    assert len(found) == 1, f"{key}= appears {len(found)} times in [{section}]"
    return found[0]


@pytest.fixture(scope="module")
def unit():
    return parse_unit(UNIT.read_text())


def test_parser_keeps_duplicates_and_continuations():
    got = parse_unit("[S]\n# c\nA=1\n; c\nA=2\nB=x \\\n  y\nC=\n")
    assert got == {"S": [("A", "1"), ("A", "2"), ("B", "x y"), ("C", "")]}


def test_type_notify_and_command(unit):
    assert one(unit, "Service", "Type") == "notify"
    assert one(unit, "Service", "ExecStart") == (
        "/usr/local/bin/meshd run --config /etc/meshd/meshd.toml"
    )


def test_restart_rules_follow_the_exit_codes(unit):
    assert one(unit, "Service", "Restart") == "on-failure"
    prevent = {int(code) for code in one(unit, "Service", "RestartPreventExitStatus").split()}
    assert prevent == {Exit.NOPERM, Exit.CONFIG} == {77, 78}
    assert one(unit, "Service", "TimeoutStopSec")


def test_directories_and_user(unit):
    assert one(unit, "Service", "StateDirectory") == "meshd"
    assert one(unit, "Service", "RuntimeDirectory") == "meshd"  # /run/meshd/meshd.sock
    # /var/cache/meshd, where the 4-bit kernel is built (ProtectHome= hides ~/.cache)
    assert one(unit, "Service", "CacheDirectory") == "meshd"
    assert "MESHD_CACHE_DIR=/var/cache/meshd" in values(unit, "Service", "Environment")
    assert one(unit, "Service", "User") == "meshd" or one(unit, "Service", "DynamicUser") == "yes"


def test_hardening(unit):
    for key, want in [
        ("NoNewPrivileges", "yes"),
        ("ProtectSystem", "strict"),
        ("ProtectHome", "yes"),
        ("PrivateTmp", "yes"),
        ("PrivateDevices", "yes"),
        ("CapabilityBoundingSet", ""),
    ]:
        assert one(unit, "Service", key) == want, key
    families = set(one(unit, "Service", "RestrictAddressFamilies").split())
    assert families == {"AF_UNIX", "AF_INET", "AF_INET6", "AF_NETLINK"}
    assert "@system-service" in values(unit, "Service", "SystemCallFilter")
    # left off on purpose (onnxruntime, libffi), and no watchdog the daemon does not feed
    assert values(unit, "Service", "MemoryDenyWriteExecute") in ([], ["no"])
    assert values(unit, "Service", "WatchdogSec") == []


def test_gpu_drop_in():
    drop_in = parse_unit(GPU_DROP_IN.read_text())
    assert one(drop_in, "Service", "PrivateDevices") == "no"
    assert one(drop_in, "Service", "DevicePolicy") == "closed"
    allowed = {v.split()[0] for v in values(drop_in, "Service", "DeviceAllow")}
    assert {"/dev/nvidiactl", "/dev/nvidia-uvm", "char-nvidia*"} <= allowed


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")
def test_systemd_analyze_verify(tmp_path):
    # verify insists that ExecStart's binary exists: point it at one that does.
    text = UNIT.read_text().replace("ExecStart=/usr/local/bin/meshd", f"ExecStart={sys.executable}")
    (tmp_path / "meshd.service").write_text(text)
    (tmp_path / "meshd.service.d").mkdir()
    shutil.copy(GPU_DROP_IN, tmp_path / "meshd.service.d" / "gpu.conf")
    done = subprocess.run(
        ["systemd-analyze", "verify", str(tmp_path / "meshd.service")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    # systemd ignores (with a warning, rc 0) a key or value it does not understand
    ignored = [line for line in done.stderr.splitlines() if "ignoring" in line.lower()]
    assert ignored == [], done.stderr
