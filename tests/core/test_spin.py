"""meshd.core.spin: when a call may run on the spinning session."""

from __future__ import annotations

import pytest

from meshd.core.spin import spin_pays


@pytest.mark.parametrize(("runnable", "cores", "threads", "want"), [
    (1, 2, 2, True),    # only the caller runnable: the second core is free
    (0, 2, 2, True),    # a count taken between two ticks; never below the caller
    (2, 2, 2, False),   # one other task: our worker would take its core
    (5, 2, 2, False),
    (3, 4, 2, True),    # two others on a 4-core box leave room for our two threads
    (4, 4, 2, False),
    (1, 2, 1, False),   # one thread: nothing to spin
    (1, 1, 2, False),   # one core
    (None, 2, 2, False),  # unknown: never spin
])
def test_spin_pays(runnable: int | None, cores: int, threads: int, want: bool) -> None:
    assert spin_pays(runnable, cores, threads) is want
