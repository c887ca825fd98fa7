"""API keys: made once, stored hashed, mapped to a client name, picked up when the file changes."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from meshd.api.auth import (
    KeyFile,
    KeyRing,
    add_key,
    bearer_token,
    key_entries,
    key_hash,
    parse_key_file,
    remove_keys,
)
from meshd.cli.main import main
from meshd.errors import ConfigError, LocalError


def test_a_key_is_stored_only_as_its_hash_mode_0600(tmp_path: Path) -> None:
    path = tmp_path / "api-keys"
    key = add_key(path, "alice")
    text = path.read_text()
    assert key not in text and key_hash(key) in text
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert parse_key_file(text, "f") == {key_hash(key): "alice"}
    other = add_key(path, "alice")  # several keys per client
    assert KeyRing(parse_key_file(path.read_text(), "f")).client(other) == "alice"
    assert key_entries(path)[0][0] == "alice"


def test_the_ring_maps_keys_to_clients_and_open_access_to_anonymous() -> None:
    ring = KeyRing({key_hash("k1"): "alice"})
    assert ring.client("k1") == "alice"
    assert ring.client("k2") is None and ring.client(None) is None
    open_ring = KeyRing({key_hash("k1"): "alice"}, open_access=True)
    assert open_ring.client(None) == "anonymous" and open_ring.client("k1") == "alice"


@pytest.mark.parametrize(("header", "token"), [
    (b"Bearer abc", "abc"), (b"bearer  abc ", "abc"), (b"Basic abc", None), (b"Bearer", None),
    (None, None), (b"", None),
])
def test_bearer_token(header: bytes | None, token: str | None) -> None:
    assert bearer_token(header) == token


def test_the_key_file_is_read_again_when_it_changes(tmp_path: Path) -> None:
    path = tmp_path / "api-keys"
    keys = KeyFile(path)
    assert keys.refresh().client("x") is None  # no file: no keys
    key = add_key(path, "bob")
    assert keys.refresh().client(key) == "bob"
    remove_keys(path, "bob")
    assert keys.refresh().client(key) is None


def test_a_bad_line_is_an_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"f:2"):
        parse_key_file("# c\nalice sha256:00\n", "f")


def test_bad_client_names_are_refused(tmp_path: Path) -> None:
    with pytest.raises(LocalError):
        add_key(tmp_path / "k", "no spaces")


def test_cli_prints_the_key_once_and_stores_its_hash(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "keys"
    assert main(["keys", "api-key", "create", "carol", "--file", str(path)]) == 0
    out = capsys.readouterr()
    key = out.out.strip()
    assert key.startswith("meshd-") and "shown only this once" in out.err
    assert KeyFile(path).refresh().client(key) == "carol"
    assert main(["keys", "api-key", "list", "--file", str(path)]) == 0
    assert "carol" in capsys.readouterr().out
    assert main(["keys", "api-key", "revoke", "carol", "--file", str(path)]) == 0
    assert KeyFile(path).refresh().client(key) is None


def test_cli_finds_the_key_file_through_the_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "meshd.toml"
    cfg.write_text('[api]\nkeys_file = "my-keys"\n')
    assert main(["keys", "api-key", "create", "dave", "--config", str(cfg)]) == 0
    key = capsys.readouterr().out.strip()
    assert KeyFile(tmp_path / "my-keys").refresh().client(key) == "dave"
    assert main(["keys", "api-key", "create", "dave"]) != 0
    assert "--file" in capsys.readouterr().err
