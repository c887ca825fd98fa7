"""Identity files and the `meshd keys` command: permissions, round trips, refusals."""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path

import pytest
from keys_helpers import new_ca

from meshd.cli.main import main
from meshd.core import cert as C
from meshd.core import crl as R
from meshd.errors import KeyFileError
from meshd.exitcodes import Exit
from meshd.net import identity as I


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_save_and_load_identity(tmp_path: Path) -> None:
    ca = new_ca()
    node = ca.issue("n1")
    I.save_identity(tmp_path / "n1", node.key_pair, node.certificate_bytes, ca.public_key)
    assert _mode(tmp_path / "n1") == 0o700
    assert _mode(tmp_path / "n1" / I.NODE_KEY_FILE) == 0o600
    loaded = I.load_identity(tmp_path / "n1", now=time.time())
    assert loaded.peer_id == node.peer_id
    assert loaded.name == "n1"
    assert loaded.certificate == node.certificate
    assert loaded.ca_public_key == ca.public_key
    assert loaded.key_pair.private_key.to_bytes() == node.key_pair.private_key.to_bytes()
    with pytest.raises(KeyFileError, match="already exists"):
        I.save_identity(tmp_path / "n1", node.key_pair, node.certificate_bytes, ca.public_key)


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o660, 0o644])
def test_refuses_a_key_readable_by_others(tmp_path: Path, mode: int) -> None:
    node = new_ca().issue("n1")
    path = tmp_path / "node.key"
    I.save_node_key(path, node.key_pair)
    os.chmod(path, mode)
    with pytest.raises(KeyFileError) as info:
        I.load_node_key(path)
    message = str(info.value)
    assert str(path) in message
    assert f"chmod 600 {path}" in message
    os.chmod(path, 0o600)
    assert I.load_node_key(path).public_key.to_bytes() == node.key_pair.public_key.to_bytes()


def test_load_identity_refusals(tmp_path: Path) -> None:
    ca, other = new_ca(), new_ca()
    node, stranger = ca.issue("n1"), ca.issue("n2")
    d = tmp_path / "n"
    with pytest.raises(KeyFileError, match="no such file"):
        I.load_identity(d)
    # A certificate of another node next to this key.
    I.save_identity(d, node.key_pair, stranger.certificate_bytes, ca.public_key)
    with pytest.raises(KeyFileError, match="peer_id_mismatch") as info:
        I.load_identity(d)
    assert str(d / I.NODE_CERT_FILE) in str(info.value)
    # The right certificate, but another CA's public key beside it.
    I.save_identity(d, node.key_pair, node.certificate_bytes, other.public_key, overwrite=True)
    with pytest.raises(KeyFileError, match="wrong_ca"):
        I.load_identity(d)
    # Expired: loads without a clock, refused with one.
    old = ca.issue("old", not_before=1000, not_after=2000)
    I.save_identity(d, old.key_pair, old.certificate_bytes, ca.public_key, overwrite=True)
    assert I.load_identity(d).name == "old"
    with pytest.raises(KeyFileError, match="expired"):
        I.load_identity(d, now=time.time())
    (d / I.NODE_KEY_FILE).write_text("not a key")
    with pytest.raises(KeyFileError, match="PEM"):
        I.load_identity(d)


def test_revocation_list_file(tmp_path: Path) -> None:
    ca, other = new_ca(), new_ca()
    rl = R.RevocationList(
        version=2, issued_at=5, ca_key_id=C.ca_key_id(ca.public_key), serials=frozenset({4})
    )
    data = R.sign_revocation_list(rl, ca.private_key)
    path = tmp_path / I.REVOCATION_FILE
    I.save_revocation_list(path, data)
    loaded, raw = I.load_revocation_list(path, ca_public_key=ca.public_key)
    assert loaded == rl
    assert raw == data
    with pytest.raises(KeyFileError, match="wrong_ca"):
        I.load_revocation_list(path, ca_public_key=other.public_key)
    path.write_bytes(b"junk")
    with pytest.raises(KeyFileError, match=str(path)):
        I.load_revocation_list(path, ca_public_key=ca.public_key)


# --------------------------------------------------------------------------- the CLI


def test_cli_init_issue_revoke_show(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ca_dir = tmp_path / "ca"
    assert main(["keys", "init-ca", "--dir", str(ca_dir)]) == Exit.OK
    assert _mode(ca_dir / I.CA_KEY_FILE) == 0o600
    assert main(["keys", "init-ca", "--dir", str(ca_dir)]) == Exit.NOPERM  # never replaced
    args = ["keys", "issue", "gw-1", "--dir", str(ca_dir), "--role", "gateway"]
    args += ["--label", "region=eu-west", "--label", "residency=eu", "--days", "30"]
    assert main(args) == Exit.OK
    node_dir = ca_dir / "nodes" / "gw-1"
    assert _mode(node_dir / I.NODE_KEY_FILE) == 0o600
    gw = I.load_identity(node_dir, now=time.time())
    assert gw.certificate.roles == ("gateway",)
    assert dict(gw.certificate.labels) == {"region": "eu-west", "residency": "eu"}
    assert gw.certificate.serial == 1
    assert 29 * 86400 < gw.certificate.not_after - time.time() <= 30 * 86400
    assert main(args) == Exit.NOPERM  # an identity is not replaced without --force
    assert main(["keys", "issue", "w-1", "--dir", str(ca_dir), "--out", str(tmp_path / "w")]) == 0
    worker = I.load_identity(tmp_path / "w")
    assert worker.certificate.serial == 2
    capsys.readouterr()

    assert main(["keys", "revoke", "2", "--dir", str(ca_dir)]) == Exit.OK
    assert "w-1" in capsys.readouterr().out
    assert main(["keys", "revoke", "5", "--dir", str(ca_dir)]) == Exit.OK
    rl, _ = I.load_revocation_list(ca_dir / I.REVOCATION_FILE, ca_public_key=gw.ca_public_key)
    assert rl.version == 2
    assert rl.serials == {2, 5}
    # A node issued after a revocation carries the list in force.
    assert main(["keys", "issue", "late", "--dir", str(ca_dir)]) == Exit.OK
    assert (ca_dir / "nodes" / "late" / I.REVOCATION_FILE).read_bytes() == (
        ca_dir / I.REVOCATION_FILE
    ).read_bytes()
    capsys.readouterr()

    assert main(["keys", "show", str(node_dir / I.NODE_CERT_FILE), "--json"]) == Exit.OK
    shown = json.loads(capsys.readouterr().out)
    assert shown["name"] == "gw-1"
    assert shown["peer_id"] == gw.peer_id.to_base58()
    assert shown["state"] == "valid now"
    assert shown["signature"].startswith("valid")
    assert main(["keys", "show", str(ca_dir / I.REVOCATION_FILE), "--json"]) == Exit.OK
    assert json.loads(capsys.readouterr().out)["revoked"] == [2, 5]
    assert main(["keys", "show", str(node_dir / I.NODE_KEY_FILE)]) == Exit.OK
    out = capsys.readouterr().out
    assert gw.peer_id.to_base58() in out
    assert "PRIVATE" not in out
    assert main(["keys", "list", "--dir", str(ca_dir), "--json"]) == Exit.OK
    states = {row["name"]: row["state"] for row in json.loads(capsys.readouterr().out)}
    assert states == {"gw-1": "valid", "w-1": "revoked", "late": "valid"}

    os.chmod(node_dir / I.NODE_KEY_FILE, 0o644)
    assert main(["keys", "show", str(node_dir / I.NODE_KEY_FILE)]) == Exit.NOPERM
    assert "chmod 600" in capsys.readouterr().err


def test_cli_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ca_dir = tmp_path / "ca"
    assert main(["keys", "issue", "n", "--dir", str(ca_dir)]) == Exit.NOPERM
    assert "init-ca" in capsys.readouterr().err
    assert main(["keys", "init-ca", "--dir", str(ca_dir)]) == Exit.OK
    for bad in (
        ["bad name"],
        ["n", "--label", "novalue"],
        ["n", "--days", "0"],
        ["n", "--role", "a b"],
    ):
        with pytest.raises(SystemExit) as info:
            main(["keys", "issue", *bad, "--dir", str(ca_dir)])
        assert info.value.code == 2
    with pytest.raises(SystemExit):
        main(["keys", "revoke", "zero", "--dir", str(ca_dir)])
    assert main(["keys"]) == Exit.USAGE
    capsys.readouterr()
    for sub in ("init-ca", "issue", "revoke", "show", "list"):
        with pytest.raises(SystemExit) as info:
            main(["keys", sub, "--help"])
        assert info.value.code == 0
        assert len(capsys.readouterr().out) > 200
