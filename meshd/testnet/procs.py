"""Find the running daemons of a testnet folder, including ones started again by hand.

``testnet.json`` only knows the processes `up` started; a node restarted by hand (``meshd run
--config DIR/n2/meshd.toml``, or from inside ``DIR/n2`` with a relative path) is not in it, and a
pid it lists may since belong to another program. A daemon belongs to the testnet in ``DIR`` when

* its command line is ``... meshd run --config FILE`` (or ``-c FILE``) with FILE, resolved against
  the process's working directory, inside ``DIR``; or
* it serves a control socket inside ``DIR`` (the peer of a connection to the socket, read with
  ``SO_PEERCRED``), whatever config it was started with.

Linux only (``/proc``); only this user's processes are considered.
"""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Iterable
from pathlib import Path

CONNECT_TIMEOUT_S = 1.0


def config_arg(argv: list[str]) -> str | None:
    """The ``--config`` of a ``meshd run`` command line, else None. Pure."""
    if "meshd" not in " ".join(argv) or "run" not in argv:
        return None
    for i, a in enumerate(argv):
        if a in ("--config", "-c") and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("--config="):
            return a.split("=", 1)[1]
    return None


def _inside(path: Path, directory: Path) -> bool:
    try:
        path.relative_to(directory)
    except ValueError:
        return False
    return True


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def by_config(directory: Path) -> set[int]:
    """Pids of this user's ``meshd run`` processes whose config file lies inside ``directory``."""
    directory = directory.resolve()
    uid = os.getuid()
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            if entry.stat().st_uid != uid:
                continue
        except OSError:
            continue
        cfg = config_arg(_cmdline(pid))
        if cfg is None:
            continue
        try:
            cwd = Path(os.readlink(f"/proc/{pid}/cwd"))
        except OSError:
            continue
        if _inside(Path(os.path.normpath(cwd / cfg)), directory):
            found.add(pid)
    return found


def socket_owner(path: Path) -> int | None:
    """The pid of the process serving the unix socket ``path`` (None: nobody, or not ours)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(CONNECT_TIMEOUT_S)
    try:
        s.connect(str(path))
        creds = s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return None
    finally:
        s.close()
    pid, uid, _ = struct.unpack("3i", creds)
    return pid if pid > 0 and uid == os.getuid() else None


def by_socket(sockets: Iterable[Path]) -> set[int]:
    return {pid for p in sockets if (pid := socket_owner(p)) is not None}


def testnet_daemons(directory: Path, sockets: Iterable[Path] = ()) -> set[int]:
    """Every running daemon of the testnet in ``directory``: by config path, and by the control
    sockets in its node folders (``DIR/*/meshd.sock``) and ``sockets`` (testnet.json's)."""
    here = set(directory.glob("*/meshd.sock")) | set(sockets)
    return (by_config(directory) | by_socket(here)) - {os.getpid()}


def is_meshd_daemon(pid: int) -> bool:
    """Whether ``pid`` runs ``meshd run`` now (a pid from testnet.json may have been reused)."""
    return config_arg(_cmdline(pid)) is not None
