"""Suite-wide settings.

Testnet daemons started by the tests run without the semantic cache (``[cache] enabled =
false``, through ``MESHD_TESTNET_CACHE=0``, read by ``meshd.testnet.launcher``): the cache would
answer repeated greedy prompts that tests expect a model to serve, and loading the embedding
model in every daemon costs CPU the suite cannot spare on 2 cores. The cache's own tests turn it
on per node (tests/node/test_cache_live.py).

Hypothesis runs without its per-example deadline (200 ms by default): on a 2-core CI box shared
with daemons an example can take longer for reasons that have nothing to do with the code, and a
deadline there fails the suite at random. What a property test checks is its assertions.

Tests that need something of the machine (markers ``docker``, ``netns`` and ``llamacpp``,
``NEEDS`` below)
skip where it is missing; the closing summary then says, per group, that it did NOT RUN and
why, or that it ran. With ``$MESHD_TEST_GROUPS_FILE`` set, the same lines are written to that
file (``.ci/run`` prints them after the suite).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

settings.register_profile("meshd", deadline=None)
settings.load_profile("meshd")

# marker -> the test group it marks (tests that skip where the machine lacks what they need)
NEEDS = {
    "docker": "the docker compose testnet (tests/compose, needs a Docker daemon)",
    "netns": "the network-namespace testnet tests (need root, `ip` and /dev/net/tun)",
    "llamacpp": "the live tests against a real llama-server (tests/upstream/test_llamacpp_live.py, "
                "need scripts/build_llama_cpp.sh's build and the SmolLM2 GGUF)",
    "browser": "the web console's browser tests (need chromium and chromium-driver)",
}


def pytest_configure(config: pytest.Config) -> None:
    os.environ.setdefault("MESHD_TESTNET_CACHE", "0")


def _skip_reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return reason.removeprefix("Skipped: ")


def group_lines(reports: list[pytest.TestReport], *, unselected: bool = False) -> list[str]:
    """Per group of ``NEEDS`` that had tests selected: "ran" or "NOT RUN ... because" (and under
    it the tests it skipped); with ``unselected``, a line for each other group too."""
    lines: list[str] = []
    for marker, group in NEEDS.items():
        ran: set[str] = set()
        skipped: dict[str, str] = {}
        for r in reports:
            if marker not in r.keywords:
                continue
            if r.skipped:
                skipped[r.nodeid] = _skip_reason(r)
            elif r.when == "call" or r.failed:
                ran.add(r.nodeid)
        if not ran and not skipped:
            if unselected:
                lines.append(f"not selected: {group}")
            continue
        if ran:
            lines.append(f"ran: {group}: {len(ran)} test(s)")
        for reason in sorted(set(skipped.values())):
            ids = sorted(n for n, why in skipped.items() if why == reason)
            lines.append(f"NOT RUN: {group}: {len(ids)} test(s) skipped because {reason}")
            lines += [f"    {n}" for n in ids]
    return lines


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    reports = [r for key in ("passed", "failed", "skipped", "error")
               for r in terminalreporter.stats.get(key, []) if isinstance(r, pytest.TestReport)]
    lines = group_lines(reports)
    out = os.environ.get("MESHD_TEST_GROUPS_FILE")
    if out:
        Path(out).write_text("".join(f"{line}\n" for line in group_lines(reports, unselected=True)))
    if lines:
        missing = any(line.startswith("NOT RUN") for line in lines)
        terminalreporter.section("tests that need the machine", sep="=", yellow=missing, bold=True)
        for line in lines:
            terminalreporter.line(line, yellow=line.startswith("NOT RUN"))
