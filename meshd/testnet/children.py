"""The processes a testnet starts (daemons, the link emulator): kept, checked and reaped.

``track`` keeps the ``Popen`` of each child until ``reap`` waits for it (so Popen does not warn
while it runs); ``alive`` says whether a pid still runs (a zombie counts as dead); ``log_tail``
gives the last lines of a child's log for an error message. ``meshd.testnet.launcher`` starts the
daemons and ``meshd.testnet.netns`` the link emulator; both use these.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


def track(proc: subprocess.Popen[bytes]) -> None:
    """Keep ``proc`` until ``reap(proc.pid)``."""
    _CHILDREN[proc.pid] = proc


def log_tail(path: Path, n: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie child counts as dead
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return True


def reap(pid: int) -> None:
    """Wait for ``pid`` if it is a child: one ``track`` kept, or any other (without blocking)."""
    proc = _CHILDREN.pop(pid, None)
    if proc is not None:
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        return
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
