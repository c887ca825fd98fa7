"""Suite-wide settings.

Testnet daemons started by the tests run without the semantic cache (``[cache] enabled =
false``, through ``MESHD_TESTNET_CACHE=0``, read by ``meshd.testnet.launcher``): the cache would
answer repeated greedy prompts that tests expect a model to serve, and loading the embedding
model in every daemon costs CPU the suite cannot spare on 2 cores. The cache's own tests turn it
on per node (tests/node/test_cache_live.py).
"""

from __future__ import annotations

import os

import pytest


def pytest_configure(config: pytest.Config) -> None:
    os.environ.setdefault("MESHD_TESTNET_CACHE", "0")
