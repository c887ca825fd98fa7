"""The closing summary names the groups of tests that need the machine (tests/conftest.py: NEEDS)
and did not run, with the reason; ``$MESHD_TEST_GROUPS_FILE`` gets the same lines for .ci/run."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

CONFTEST = Path(__file__).with_name("conftest.py")
BROWSER = "the web console's browser tests (need chromium and chromium-driver)"
LLAMACPP = ("the live tests against a real llama-server (tests/upstream/test_llamacpp_live.py, need "
            "scripts/build_llama_cpp.sh's build and the SmolLM2 GGUF)")
INI = """
[pytest]
addopts = -ra --strict-markers
markers =
    docker: needs Docker
    netns: needs network namespaces
"""
# every namespace test skipped by the module's mark
TESTS = """
import pytest

pytestmark = pytest.mark.skipif(True, reason="network namespaces unavailable: need root")

@pytest.mark.netns
def test_emulated_a(): pass

@pytest.mark.netns
def test_emulated_b(): pass

@pytest.fixture
def compose():
    pytest.skip("`docker info` failed (no Docker daemon)")

@pytest.mark.docker
def test_compose(compose): pass
"""

# the compose test skips in its fixture, one namespace test runs and the other skips
MIXED = """
import pytest

@pytest.mark.netns
def test_emulated_a(): pass

@pytest.mark.netns
@pytest.mark.skip(reason="no tun")
def test_emulated_b(): pass

@pytest.fixture
def compose():
    pytest.skip("`docker info` failed (no Docker daemon)")

@pytest.mark.docker
def test_compose(compose): pass

def test_plain(): pass
"""


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makeini(INI)
    return pytester


def test_skipped_groups_are_named_with_their_reason_at_the_end(
        suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    suite.makepyfile(test_machine=MIXED)
    report = suite.path / "groups.txt"
    monkeypatch.setenv("MESHD_TEST_GROUPS_FILE", str(report))
    result = suite.runpytest("-q")
    result.assert_outcomes(passed=2, skipped=2)
    lines = result.stdout.lines
    start = next(i for i, line in enumerate(lines) if "tests that need the machine" in line)
    said = lines[start + 1:start + 6]
    assert said == [
        "NOT RUN: the docker compose testnet (tests/compose, needs a Docker daemon): 1 test(s) "
        "skipped because `docker info` failed (no Docker daemon)",
        "    test_machine.py::test_compose",
        "ran: the network-namespace testnet tests (need root, `ip` and /dev/net/tun): 1 test(s)",
        "NOT RUN: the network-namespace testnet tests (need root, `ip` and /dev/net/tun): 1 test(s) "
        "skipped because no tun",
        "    test_machine.py::test_emulated_b",
    ]
    assert report.read_text().splitlines() == [*said, f"not selected: {LLAMACPP}",
                                               f"not selected: {BROWSER}"]


def test_a_group_skipped_whole_is_not_run_and_an_unselected_one_only_in_the_file(
        suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    suite.makepyfile(test_machine=TESTS)
    report = suite.path / "groups.txt"
    monkeypatch.setenv("MESHD_TEST_GROUPS_FILE", str(report))
    result = suite.runpytest("-q", "-k", "emulated")
    result.assert_outcomes(skipped=2)
    assert report.read_text().splitlines() == [
        "not selected: the docker compose testnet (tests/compose, needs a Docker daemon)",
        "NOT RUN: the network-namespace testnet tests (need root, `ip` and /dev/net/tun): 2 test(s) "
        "skipped because network namespaces unavailable: need root",
        "    test_machine.py::test_emulated_a",
        "    test_machine.py::test_emulated_b",
        f"not selected: {LLAMACPP}",
        f"not selected: {BROWSER}",
    ]
    result.stdout.fnmatch_lines(["*tests that need the machine*", "NOT RUN: the network-namespace*"])


def test_nothing_selected_that_needs_the_machine_prints_no_block(
        suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    suite.makepyfile(test_plain="def test_plain(): pass\n")
    report = suite.path / "groups.txt"
    monkeypatch.setenv("MESHD_TEST_GROUPS_FILE", str(report))
    result = suite.runpytest("-q")
    result.assert_outcomes(passed=1)
    assert "tests that need the machine" not in result.stdout.str()
    assert report.read_text().splitlines() == [
        "not selected: the docker compose testnet (tests/compose, needs a Docker daemon)",
        "not selected: the network-namespace testnet tests (need root, `ip` and /dev/net/tun)",
        f"not selected: {LLAMACPP}",
        f"not selected: {BROWSER}",
    ]
