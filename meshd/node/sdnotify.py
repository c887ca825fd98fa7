"""The systemd notification protocol (sd_notify), without a dependency.

systemd passes ``$NOTIFY_SOCKET`` to a ``Type=notify`` service: a unix datagram socket path,
or an abstract-namespace name when it starts with ``@``. The daemon sends newline-separated
``KEY=value`` assignments to it: ``READY=1`` once it serves, ``STOPPING=1`` when it begins to
shut down, ``STATUS=...`` for ``systemctl status``. Outside systemd the variable is unset and
every call is a no-op. A failure to notify is logged and reported, never raised: it must not
take the daemon down (systemd will notice a missing READY=1 by its start timeout).
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping

log = logging.getLogger(__name__)

READY = "READY=1"
STOPPING = "STOPPING=1"
RELOADING = "RELOADING=1"
WATCHDOG = "WATCHDOG=1"


def socket_address(value: str) -> str | None:
    """The ``AF_UNIX`` address for a ``$NOTIFY_SOCKET`` value, or ``None`` if unusable."""
    if value.startswith("@") and len(value) > 1:
        return "\0" + value[1:]
    if value.startswith("/"):
        return value
    return None  # empty, relative, or a transport we do not speak (e.g. vsock:)


def notify(state: str, env: Mapping[str, str] = os.environ) -> bool:
    """Send ``state`` (e.g. ``"READY=1\\nSTATUS=serving"``) to ``$NOTIFY_SOCKET``.

    Returns True when the datagram was sent, False when there is no socket to send to or
    sending failed (logged).
    """
    value = env.get("NOTIFY_SOCKET", "")
    if not value:
        return False
    address = socket_address(value)
    if address is None:
        log.warning("sd_notify unsupported socket=%r", value)
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.settimeout(1.0)
            sock.sendto(state.encode("utf-8"), address)
    except OSError as err:
        log.warning("sd_notify failed socket=%r error=%r", value, err)
        return False
    return True


def ready(status: str | None = None, env: Mapping[str, str] = os.environ) -> bool:
    return notify(READY if status is None else f"{READY}\nSTATUS={status}", env)


def stopping(env: Mapping[str, str] = os.environ) -> bool:
    return notify(STOPPING, env)


def watchdog_interval_s(
    env: Mapping[str, str] = os.environ, pid: int | None = None
) -> float | None:
    """Half the watchdog period systemd asks for (``WatchdogSec=``), or ``None`` when none
    is set for this process. A daemon that wants the watchdog sends ``WATCHDOG=1`` this
    often; the shipped unit sets no ``WatchdogSec=``."""
    usec = env.get("WATCHDOG_USEC", "")
    owner = env.get("WATCHDOG_PID", "")
    if not usec.isascii() or not usec.isdigit() or int(usec) <= 0:
        return None
    if owner and owner != str(os.getpid() if pid is None else pid):
        return None
    return int(usec) / 2_000_000
