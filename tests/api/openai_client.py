"""The official ``openai`` client as the live API tests use it against a testnet node."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import openai
import pytest

from meshd.testnet.drive import wait_for
from meshd.testnet.launcher import NodeSpec, down, up


def client(url: str, key: str, timeout: float = 60) -> openai.OpenAI:
    """A client that never retries (a test sees every error) with a per-request timeout."""
    return openai.OpenAI(base_url=url, api_key=key, max_retries=0, timeout=timeout)


def listed_models(url: str, key: str, timeout: float = 60) -> list[str]:
    """The ids ``GET /v1/models`` lists now ([] while the node cannot answer)."""
    try:
        return [m.id for m in client(url, key, timeout).models.list()]
    except openai.APIError:
        return []


@contextmanager
def api_mesh(net: Path, specs: list[NodeSpec], model: str, *, timeout_s: float = 30,
             default_model: Path | None = None) -> Iterator[dict[str, Any]]:
    """A testnet of ``specs`` under ``net`` (``$MESHD_DEFAULT_MODEL`` set to ``default_model``
    for its daemons when given), once its first node lists ``model``: its index, with the API
    key under ``"key"``. Taken down on leaving."""
    with pytest.MonkeyPatch.context() as mp:
        if default_model is not None:
            mp.setenv("MESHD_DEFAULT_MODEL", str(default_model))
        index = up(net, specs, advert_interval_s=1.0)
    try:
        index["key"] = Path(index["api_key_file"]).read_text().strip()
        url = index["nodes"][0]["api_url"]
        wait_for(lambda: model in listed_models(url, index["key"]), timeout_s,
                 f"{index['nodes'][0]['name']} to hear of {model}")
        yield index
    finally:
        down(net)
