"""Waiting on a condition with a deadline, never on the clock alone: the one helper of tests
and benchmarks (``wait_for`` polls from plain code, ``wait_until`` from inside trio)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import trio

T = TypeVar("T")


def wait_for(cond: Callable[[], T], timeout: float, what: str | Callable[[], str], *,
             poll_s: float = 0.1) -> T:
    """Poll ``cond`` until it returns something true (returned) or ``timeout`` seconds pass
    (AssertionError naming ``what``; a callable is asked at the end, for the state then)."""
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            said = what() if callable(what) else what
            raise AssertionError(f"timed out after {timeout} s waiting for {said}")
        time.sleep(poll_s)


async def wait_until(predicate: Callable[[], Any], timeout_s: float = 3.0, *,
                     poll_s: float = 0.005) -> None:
    """Wait inside trio for ``predicate()`` to be true, under a deadline (``trio.TooSlowError``)."""
    with trio.fail_after(timeout_s):
        while not predicate():
            await trio.sleep(poll_s)
