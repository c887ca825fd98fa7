"""Suite-wide settings.

Testnet daemons started by the tests run without the semantic cache (``[cache] enabled =
false``, through ``MESHD_TESTNET_CACHE=0``, read by ``meshd.testnet.launcher``): the cache would
answer repeated greedy prompts that tests expect a model to serve, and loading the embedding
model in every daemon costs CPU the suite cannot spare on 2 cores. The cache's own tests turn it
on per node (tests/node/test_cache_live.py).

Hypothesis runs without its per-example deadline (200 ms by default): on a 2-core CI box shared
with daemons an example can take longer for reasons that have nothing to do with the code, and a
deadline there fails the suite at random. What a property test checks is its assertions.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

settings.register_profile("meshd", deadline=None)
settings.load_profile("meshd")


def pytest_configure(config: pytest.Config) -> None:
    os.environ.setdefault("MESHD_TESTNET_CACHE", "0")
