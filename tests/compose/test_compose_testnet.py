"""The docker-compose testnet of deploy/ (docs/compose.md), run for real.

Builds meshd's wheel and the image from it, brings up the init service and three daemons with
compose, waits until every node lists the other two, submits a prompt through node1's control
socket with the `client` service, checks the answer and its route, and removes everything
(`down -v`) even when a step fails. Skipped only where `docker info` fails.

Base image: $MESHD_BASE_IMAGE, else `meshd-base:bookworm` where deploy/make-base-image.sh made
it (.ci/docker-setup does), else python:3.11-slim from a registry.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.docker

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
NODES = ("node1", "node2", "node3")
IMAGE = "meshd:test"
LOCAL_BASE = "meshd-base:bookworm"
BUILD_TIMEOUT_S = 900.0
MESH_TIMEOUT_S = 180.0
SUBMIT_TIMEOUT_S = 120.0


def _run(argv: list[str], *, timeout_s: float, env: dict[str, str] | None = None,
         check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, env=env,
                          stdin=subprocess.DEVNULL, cwd=REPO)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} exited {proc.returncode}:\n"
                             f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def _docker_unavailable() -> str | None:
    if shutil.which("docker") is None:
        return "docker is not installed"
    try:
        proc = _run(["docker", "info"], timeout_s=30, check=False)
    except subprocess.TimeoutExpired:
        return "`docker info` did not answer within 30 s"
    if proc.returncode != 0:
        return "`docker info` failed (no Docker daemon): " + (proc.stderr.strip().splitlines() or [""])[-1]
    return None


def _compose_cmd() -> list[str]:
    """Compose v2 (`docker compose`) where the plugin exists, else v1 (`docker-compose`)."""
    if _run(["docker", "compose", "version"], timeout_s=30, check=False).returncode == 0:
        return ["docker", "compose"]
    exe = shutil.which("docker-compose")
    if exe:
        return [exe]
    pytest.fail("Docker runs but there is no Compose: install the compose plugin or "
                "`docker-compose` (Debian's package or PyPI's)")


def _base_image() -> str:
    if os.environ.get("MESHD_BASE_IMAGE"):
        return os.environ["MESHD_BASE_IMAGE"]
    if _run(["docker", "image", "inspect", LOCAL_BASE], timeout_s=30, check=False).returncode == 0:
        return LOCAL_BASE
    return "python:3.11-slim"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Compose:
    """One compose project of deploy/compose.yaml, named apart from any user's testnet."""

    def __init__(self, cmd: list[str]) -> None:
        self.cmd = cmd
        self.project = f"meshd-test-{os.getpid()}"
        self.argv = [*cmd, "-p", self.project, "-f", str(DEPLOY / "compose.yaml")]
        self.env = {**os.environ, "MESHD_IMAGE": IMAGE, "MESHD_BASE_IMAGE": _base_image()}
        for i, _ in enumerate(NODES, 1):
            self.env[f"MESHD_API_PORT_NODE{i}"] = str(_free_port())

    def __call__(self, *args: str, timeout_s: float = 120.0,
                 check: bool = True) -> subprocess.CompletedProcess[str]:
        return _run([*self.argv, *args], timeout_s=timeout_s, env=self.env, check=check)

    def peers(self, node: str) -> set[str] | None:
        """Names in ``node``'s peer table, or None while its daemon does not answer."""
        try:
            proc = self("exec", "-T", node, "meshd", "peers", "--json", timeout_s=30, check=False)
        except subprocess.TimeoutExpired:
            return None
        if proc.returncode != 0:
            return None
        try:
            return {p["name"] for p in json.loads(proc.stdout)}
        except (ValueError, KeyError, TypeError):
            return None

    def wait_mesh(self, timeout_s: float) -> float:
        """Return the seconds it took until every node lists the other two."""
        t0 = time.monotonic()
        seen: dict[str, set[str] | None] = dict.fromkeys(NODES)
        while True:
            for n in NODES:
                if seen[n] != set(NODES) - {n}:
                    seen[n] = self.peers(n)
            if all(seen[n] == set(NODES) - {n} for n in NODES):
                return time.monotonic() - t0
            running = self("ps", "--services", "--filter", "status=running", timeout_s=30).stdout.split()
            if not set(NODES) <= set(running):
                raise AssertionError(f"a node exited (running: {running}):\n{self.logs()}")
            if time.monotonic() - t0 > timeout_s:
                raise AssertionError(f"mesh did not form within {timeout_s:.0f} s: {seen}\n{self.logs()}")
            time.sleep(0.5)  # between polls of a condition, under the deadline above

    def logs(self) -> str:
        try:
            proc = self("logs", "--no-color", "--tail", "40", timeout_s=60, check=False)
        except subprocess.TimeoutExpired:
            return "(compose logs timed out)"
        return proc.stdout[-6000:]


@pytest.fixture
def compose() -> Iterator[Compose]:
    reason = _docker_unavailable()
    if reason:
        pytest.skip(reason)
    c = Compose(_compose_cmd())
    try:
        yield c
    finally:
        c("down", "-v", "--remove-orphans", "--timeout", "20", timeout_s=180, check=False)


def test_compose_testnet_answers(compose: Compose) -> None:
    t0 = time.monotonic()
    if sys.version_info[:2] != (3, 11):
        pytest.fail("deploy/build-wheels.sh needs Python 3.11 (the image's) to run the tests")
    _run([str(DEPLOY / "build-wheels.sh")], timeout_s=BUILD_TIMEOUT_S,
         env={**os.environ, "PYTHON": sys.executable})
    compose("build", "init", timeout_s=BUILD_TIMEOUT_S)  # every service runs this one image
    t_built = time.monotonic()

    compose("up", "-d", timeout_s=300)
    formed_s = compose.wait_mesh(MESH_TIMEOUT_S)

    proc = compose("run", "--rm", "-T", "client", "meshd", "submit", "--json",
                   "--max-tokens", "16", "In the beginning", timeout_s=SUBMIT_TIMEOUT_S)
    result = json.loads(proc.stdout)
    assert result["text"].strip(), result
    assert result["tokens"] > 0, result
    assert result["served_by"] in NODES, result
    assert result["route"] and set(result["route"]) <= set(NODES), result
    assert result["route"][0] == "node1", result  # the client entered through node1's socket
    print(f"\ncompose testnet ({' '.join(compose.cmd)}, base {compose.env['MESHD_BASE_IMAGE']}): "
          f"wheels+image {t_built - t0:.1f} s, mesh formed {formed_s:.1f} s after up, "
          f"route {' -> '.join(result['route'])}, answer {result['text']!r}")
