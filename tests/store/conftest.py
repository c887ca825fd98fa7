from __future__ import annotations

import pytest

from meshd.store import Store


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "state" / "meshd.db")
    yield s
    s.close()
