"""The official ``openai`` client as the live API tests use it against a testnet node."""

from __future__ import annotations

import openai


def client(url: str, key: str, timeout: float = 60) -> openai.OpenAI:
    """A client that never retries (a test sees every error) with a per-request timeout."""
    return openai.OpenAI(base_url=url, api_key=key, max_retries=0, timeout=timeout)


def listed_models(url: str, key: str, timeout: float = 60) -> list[str]:
    """The ids ``GET /v1/models`` lists now ([] while the node cannot answer)."""
    try:
        return [m.id for m in client(url, key, timeout).models.list()]
    except openai.APIError:
        return []
