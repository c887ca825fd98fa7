"""Restart backoff: how long to wait before starting a failed helper again (pure)."""

from __future__ import annotations


def backoff_s(failures: int, *, base_s: float = 1.0, cap_s: float = 60.0) -> float:
    """Seconds to wait after ``failures`` failures in a row: ``base_s`` doubled per failure
    after the first, at most ``cap_s`` (0 failures: no wait)."""
    if failures <= 0:
        return 0.0
    return float(min(cap_s, base_s * 2.0 ** min(failures - 1, 62)))
