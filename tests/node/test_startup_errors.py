"""`meshd run` refuses what it cannot serve with one line and the right exit code (issue 13,
defects 6 and 7): a listen port or control socket already held by a running daemon, an invalid
listen or bootstrap address, a socket path under a regular file, an unusable model folder.

Real `meshd run` processes; most serve no model, so they fail (or start) in about a second. One
daemon runs for the module to collide with. Every wait has a deadline.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from meshd.engine import default_model_path
from meshd.exitcodes import Exit
from meshd.testnet.children import alive, reap
from meshd.testnet.drive import cli, wait_for
from meshd.testnet.launcher import (
    NodeSpec,
    free_port,
    issue_keys,
    node_config,
    start_process,
    write_toml,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """One daemon (no model) with its config; other configs are written from it."""
    d = tmp_path_factory.mktemp("startup")
    spec = NodeSpec(name="a", port=free_port(), models=[])
    issue_keys(d, [spec])
    cfg = node_config(spec, d / "a", [], advert_interval_s=1.0)
    (d / "a" / "meshd.toml").write_text(write_toml(cfg))
    pid = start_process(d / "a")
    sock = d / "a" / "meshd.sock"
    try:
        wait_for(lambda: sock.exists() or not alive(pid), 60, "the daemon's control socket")
        assert alive(pid), (d / "a" / "meshd.log").read_text()
        yield {"dir": d / "a", "cfg": cfg, "port": spec.port, "pid": pid}
    finally:
        os.kill(pid, signal.SIGTERM)
        wait_for(lambda: not alive(pid), 15, "the daemon to stop")
        reap(pid)


def _variant(running: dict[str, Any], name: str, **node: Any) -> Path:
    """A config for another daemon with the same keys: its own state, socket and port unless
    ``node`` says otherwise; ``models`` may replace the models."""
    cfg = {k: (dict(v) if isinstance(v, dict) else v) for k, v in running["cfg"].items()}
    d = running["dir"]
    cfg["node"].update({"data_dir": str(d / f"state-{name}"), "socket": str(d / f"{name}.sock"),
                        "listen": ["/ip4/127.0.0.1/tcp/0"]})
    if "models" in node:
        cfg["models"] = node.pop("models")
    cfg["node"].update(node)
    path = d / f"{name}.toml"
    path.write_text(write_toml(cfg))
    return path


def _refused(config: Path, *expect: str, code: int = Exit.CONFIG) -> str:
    proc = cli("run", "--config", str(config), check=False, timeout=120)
    err = proc.stderr.strip()
    assert proc.returncode == code, f"exit {proc.returncode}:\n{proc.stdout}\n{err}"
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    for e in expect:
        assert e in err, err
    return err


def test_second_daemon_on_a_running_nodes_port_refuses_to_start(running: dict[str, Any]) -> None:
    port = running["port"]
    _refused(_variant(running, "same-port", listen=[f"/ip4/127.0.0.1/tcp/{port}"]),
             "[node] listen[0]", f"port {port} is already in use")
    _refused(_variant(running, "same-port-any", listen=[f"/ip4/0.0.0.0/tcp/{port}"]),
             f"port {port} is already in use")
    assert alive(running["pid"])


def test_control_socket_served_by_another_daemon(running: dict[str, Any]) -> None:
    _refused(_variant(running, "same-sock", socket=str(running["dir"] / "meshd.sock")),
             "already served by another running daemon")
    assert (running["dir"] / "meshd.sock").exists() and alive(running["pid"])


def test_invalid_listen_multiaddr(running: dict[str, Any]) -> None:
    _refused(_variant(running, "bad-listen", listen=["/ip4/127.0.0.1/tcpx/1"]),
             "[node] listen[0]", "tcpx")
    _refused(_variant(running, "no-port", listen=["/ip4/127.0.0.1"]), "[node] listen[0]")


def test_listen_address_not_on_this_host(running: dict[str, Any]) -> None:
    _refused(_variant(running, "foreign", listen=["/ip4/192.0.2.7/tcp/4001"]),
             "[node] listen[0]", "cannot bind")


def test_socket_path_under_a_regular_file(running: dict[str, Any]) -> None:
    blocker = running["dir"] / "a-file"
    blocker.write_text("not a folder")
    _refused(_variant(running, "sock-under-file", socket=str(blocker / "meshd.sock")),
             f"{blocker} is a file, not a folder")


def test_malformed_bootstrap_address_is_a_config_error(running: dict[str, Any]) -> None:
    _refused(_variant(running, "bad-boot", bootstrap=["/ip4/127.0.0.1/tcp/1/p2p/notapeer"]),
             "[node] bootstrap[0]")
    _refused(_variant(running, "boot-no-p2p", bootstrap=["/ip4/127.0.0.1/tcp/1"]),
             "[node] bootstrap[0]")


def _model_copy(running: dict[str, Any], name: str) -> Path:
    dst = running["dir"] / f"model-{name}"
    shutil.copytree(default_model_path(), dst)
    return dst


def _flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


MODEL_CASES = {
    "missing": (lambda m: shutil.rmtree(m), "does not exist"),
    "corrupt-graph": (lambda m: _flip_a_byte(m / "layers-0-6.onnx"), "hash mismatch"),
    "short-weights": (lambda m: (m / "weights.bin").write_bytes((m / "weights.bin").read_bytes()[:-64]),
                      "truncated"),
    "bad-manifest": (lambda m: (m / "manifest.json").write_text('{"format": '), "not valid JSON"),
    "corrupt-tokenizer": (lambda m: (m / "tokenizer.json").write_text("{}"), "hash mismatch"),
}


@pytest.mark.parametrize("case", sorted(MODEL_CASES))
def test_unusable_model_folder_is_a_config_error_naming_the_folder(
        running: dict[str, Any], case: str) -> None:
    model = _model_copy(running, case)
    damage, words = MODEL_CASES[case]
    damage(model)
    err = _refused(_variant(running, f"model-{case}", models=[{"path": str(model)}]),
                   "[[models]][0].path", words)
    assert str(model) in err


def test_port_shared_through_so_reuseport_is_refused_at_listen(tmp_path: Path) -> None:
    """The race the probe cannot close: another process binds the port with SO_REUSEPORT after
    the probe. libp2p's listener must not join it (it sets SO_REUSEPORT itself), and the daemon
    must notice that libp2p did not listen (libp2p only logs that at debug level)."""
    import trio
    from multiaddr import Multiaddr

    from meshd.errors import ConfigError
    from meshd.net.attest import Attestor, make_host
    from meshd.net.identity import load_identity
    from meshd.net.listen import ensure_listening, install_exclusive_listen

    assert install_exclusive_listen()
    spec = NodeSpec(name="r", models=[])
    issue_keys(tmp_path, [spec])
    ident = load_identity(tmp_path / "r", now=__import__("time").time())
    other = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    other.bind(("127.0.0.1", 0))
    other.listen(8)
    port = other.getsockname()[1]

    async def main() -> None:
        host = make_host(ident, Attestor(ident.ca_public_key))
        listen = [Multiaddr(f"/ip4/127.0.0.1/tcp/{port}")]
        with trio.fail_after(30):
            async with host.run(listen):
                with pytest.raises(ConfigError, match=f"cannot listen on /ip4/127.0.0.1/tcp/{port}"):
                    ensure_listening(host, listen)

    try:
        trio.run(main)
    finally:
        other.close()
