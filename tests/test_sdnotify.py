"""sd_notify against a real unix datagram socket standing in for systemd."""

from __future__ import annotations

import os
import socket

import pytest

from meshd.node import sdnotify


@pytest.fixture
def listener(tmp_path):
    path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(5.0)
    yield str(path), sock
    sock.close()


def test_sends_to_a_path(listener):
    path, sock = listener
    assert sdnotify.notify("READY=1\nSTATUS=serving", env={"NOTIFY_SOCKET": path})
    assert sock.recv(4096) == b"READY=1\nSTATUS=serving"
    assert sdnotify.ready("3 peers", env={"NOTIFY_SOCKET": path})
    assert sock.recv(4096) == b"READY=1\nSTATUS=3 peers"
    assert sdnotify.stopping(env={"NOTIFY_SOCKET": path})
    assert sock.recv(4096) == b"STOPPING=1"


def test_sends_to_the_abstract_namespace():
    name = f"meshd-test-{os.getpid()}-{os.urandom(4).hex()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(5.0)
        assert sdnotify.notify("READY=1", env={"NOTIFY_SOCKET": "@" + name})
        assert sock.recv(4096) == b"READY=1"


@pytest.mark.parametrize("env", [{}, {"NOTIFY_SOCKET": ""}])
def test_no_op_without_a_socket(env):
    assert sdnotify.notify("READY=1", env=env) is False


@pytest.mark.parametrize("value", ["relative/sock", "vsock:2:1234", "@"])
def test_unsupported_address_is_reported_not_raised(value):
    assert sdnotify.notify("READY=1", env={"NOTIFY_SOCKET": value}) is False


def test_nobody_listening_is_reported_not_raised(tmp_path):
    assert sdnotify.notify("READY=1", env={"NOTIFY_SOCKET": str(tmp_path / "gone.sock")}) is False


def test_default_env_is_the_process_environment(listener, monkeypatch):
    path, sock = listener
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    assert sdnotify.notify("STATUS=hi")
    assert sock.recv(4096) == b"STATUS=hi"


@pytest.mark.parametrize(
    ("env", "pid", "expected"),
    [
        ({"WATCHDOG_USEC": "10000000"}, 5, 5.0),
        ({"WATCHDOG_USEC": "10000000", "WATCHDOG_PID": "5"}, 5, 5.0),
        ({"WATCHDOG_USEC": "10000000", "WATCHDOG_PID": "6"}, 5, None),
        ({"WATCHDOG_USEC": "0"}, 5, None),
        ({"WATCHDOG_USEC": "x"}, 5, None),
        ({}, 5, None),
    ],
)
def test_watchdog_interval(env, pid, expected):
    assert sdnotify.watchdog_interval_s(env, pid=pid) == expected
