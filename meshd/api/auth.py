"""API keys: bearer tokens, each mapped to a client name (the name quotas count against).

A key is shown once, when ``meshd keys api-key create NAME`` makes it; the key file keeps only
its SHA-256 (keys are 256 random bits, so a plain hash is as strong as a slow one and costs
microseconds per request). The file is text, one key a line: ``NAME<TAB>sha256:HEX<TAB>CREATED``,
``#`` starts a comment; it is written mode 0600. The daemon reads it again when it changes, so a
new key works without a restart.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from meshd.errors import ConfigError, LocalError

KEY_PREFIX = "meshd-"
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
MAX_KEY_FILE_BYTES = 4 * 1024 * 1024


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def key_hash(key: str) -> str:
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()


def check_name(name: str) -> str:
    if not NAME.match(name):
        raise LocalError(f"client name {name!r} must be 1-64 letters, digits, '.', '_' or '-', "
                         "starting with a letter or digit")
    return name


def parse_key_file(text: str, where: str) -> dict[str, str]:
    """hash -> client name; raises ConfigError naming the line of a bad entry."""
    out: dict[str, str] = {}
    for i, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split("\t")
        if len(parts) < 2 or not NAME.match(parts[0]) or not re.fullmatch(r"sha256:[0-9a-f]{64}", parts[1]):
            raise ConfigError(f"{where}:{i}: not an API key entry (NAME<TAB>sha256:HEX<TAB>CREATED)")
        out[parts[1]] = parts[0]
    return out


def bearer_token(authorization: bytes | None) -> str | None:
    """The token of an ``Authorization: Bearer TOKEN`` header, or None."""
    if not authorization:
        return None
    scheme, _, token = authorization.decode("latin-1").strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


@dataclass
class KeyRing:
    """The keys of a key file: ``client(token)`` is the client's name, or None for an unknown
    key. With ``open_access`` (``auth = "none"``) every request is ``anonymous``, and a key
    that is given and known still names its client."""

    by_hash: dict[str, str]
    open_access: bool = False

    def client(self, token: str | None) -> str | None:
        if token is not None:
            name = self.by_hash.get(key_hash(token))
            if name is not None:
                return name
        return "anonymous" if self.open_access else None


class KeyFile:
    """The key file of ``[api] keys_file``, read again whenever its size or mtime changes (one
    ``stat`` at most every ``check_interval_s``, 0 in tests). A missing file is no keys: every
    request is refused until one is made."""

    def __init__(self, path: Path, *, open_access: bool = False,
                 check_interval_s: float = 0.0) -> None:
        self.path = path
        self.open_access = open_access
        self.check_interval_s = check_interval_s
        self._seen: tuple[int, int] | None = None
        self._checked = -1e18
        self.ring = KeyRing({}, open_access)
        self.refresh()

    def refresh(self, now: float | None = None) -> KeyRing:
        """The keys, read again if the file changed; ``now`` (a monotonic clock) lets a caller
        skip the ``stat`` within ``check_interval_s`` of the last one."""
        if now is not None:
            if now - self._checked < self.check_interval_s:
                return self.ring
            self._checked = now
        try:
            st = self.path.stat()
        except OSError:
            if self._seen is not None:
                self._seen, self.ring = None, KeyRing({}, self.open_access)
            return self.ring
        seen = (st.st_mtime_ns, st.st_size)
        if seen != self._seen:
            if st.st_size > MAX_KEY_FILE_BYTES:
                raise ConfigError(f"{self.path}: key file larger than {MAX_KEY_FILE_BYTES} bytes")
            self.ring = KeyRing(parse_key_file(self.path.read_text(), str(self.path)),
                                self.open_access)
            self._seen = seen
        return self.ring


def add_key(path: Path, name: str, *, now: float | None = None) -> str:
    """Make a key for client ``name``, append its hash to ``path`` (created mode 0600) and
    return the key: the only time it is ever seen."""
    check_name(name)
    key = new_key()
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() if now is None else now))
    old = path.read_text() if path.exists() else "# meshd API keys: NAME<TAB>sha256:HEX<TAB>CREATED\n"
    parse_key_file(old, str(path))  # never append to a file we could not read back
    if old and not old.endswith("\n"):
        old += "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(old + f"{name}\t{key_hash(key)}\t{created}\n")
    tmp.replace(path)
    return key


def key_entries(path: Path) -> list[tuple[str, str]]:
    """(client name, created) of each key in ``path``, in file order; never the hashes."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        parts = line.strip().split("\t")
        if line.strip() and not line.startswith("#") and len(parts) >= 2:
            out.append((parts[0], parts[2] if len(parts) > 2 else ""))
    return out


def remove_keys(path: Path, name: str) -> int:
    """Drop every key of client ``name`` from ``path``; returns how many were dropped."""
    if not path.exists():
        return 0
    text = path.read_text()
    parse_key_file(text, str(path))
    kept, dropped = [], 0
    for line in text.splitlines():
        if line.strip() and not line.startswith("#") and line.split("\t")[0] == name:
            dropped += 1
        else:
            kept.append(line)
    if dropped:
        tmp = path.with_name(path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write("\n".join(kept) + "\n")
        tmp.replace(path)
    return dropped
