"""Where meshd looks for things when the user gives no path."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

SYSTEM_SOCKET = Path("/run/meshd/meshd.sock")


def control_socket_path(cfg: Any) -> Path:
    """The control socket of the daemon run with ``cfg`` (a ``meshd.config.Config``):
    ``[node] socket``, else ``meshd.sock`` in ``[node] data_dir``."""
    if cfg.node.socket:
        return Path(cfg.path(cfg.node.socket))
    return Path(cfg.path(cfg.node.data_dir)) / "meshd.sock"


def state_home() -> Path:
    base = os.environ.get("MESHD_HOME")
    if base:
        return Path(base)
    xdg = os.environ.get("XDG_STATE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".local" / "state") / "meshd"


def cache_home() -> Path:
    """Where meshd keeps what it can rebuild (imported embedding models): ``$MESHD_CACHE_DIR``,
    else ``$XDG_CACHE_HOME/meshd``, else ``~/.cache/meshd``."""
    base = os.environ.get("MESHD_CACHE_DIR")
    if base:
        return Path(base)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "meshd"


def models_home() -> Path:
    """The models folder: where `meshd model pull` installs models and `meshd model list` looks
    (``$MESHD_MODELS_DIR``, else ``models`` in the state folder: ``$MESHD_HOME``, else
    ``$XDG_STATE_HOME/meshd``, else ``~/.local/state/meshd``)."""
    base = os.environ.get("MESHD_MODELS_DIR")
    return Path(base) if base else state_home() / "models"


def last_testnet_file() -> Path:
    return state_home() / "last-testnet"


def default_testnet_dir() -> Path:
    return state_home() / "testnet"


def remember_testnet(directory: Path) -> None:
    f = last_testnet_file()
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_text(str(directory.resolve()) + "\n")


def last_testnet_dir() -> Path | None:
    try:
        p = Path(last_testnet_file().read_text().strip())
    except OSError:
        return None
    return p if (p / "testnet.json").exists() else None


def testnet_sockets(directory: Path) -> list[Path]:
    try:
        data = json.loads((directory / "testnet.json").read_text())
    except (OSError, ValueError):
        return []
    return [Path(n["socket"]) for n in data.get("nodes", []) if "socket" in n]


def socket_candidates(explicit: str | None) -> list[Path]:
    """Sockets to try, in order: --socket, $MESHD_SOCKET, the system daemon, the last testnet."""
    if explicit:
        return [Path(explicit)]
    out: list[Path] = []
    env = os.environ.get("MESHD_SOCKET")
    if env:
        out.append(Path(env))
    runtime = os.environ.get("RUNTIME_DIRECTORY")
    if runtime:
        out.append(Path(runtime) / "meshd.sock")
    out.append(SYSTEM_SOCKET)
    last = last_testnet_dir()
    if last is not None:
        out.extend(testnet_sockets(last)[:1])
    return out
