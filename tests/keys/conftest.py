"""Fixtures for the key and attestation tests (helpers live in keys_helpers.py)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from keys_helpers import CA, new_ca


@pytest.fixture
def ca() -> CA:
    return new_ca()


@pytest.fixture
def make_ca() -> Callable[[], CA]:
    return new_ca
