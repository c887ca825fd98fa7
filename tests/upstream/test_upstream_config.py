"""[[models]] upstream: what a valid entry needs, and clear errors otherwise."""

from __future__ import annotations

from typing import Any

import pytest

from meshd.config import parse_config
from meshd.errors import ConfigError

GOOD = {"name": "llama-up", "upstream": "http://127.0.0.1:8000/v1", "upstream_model": "llama"}


def test_a_valid_upstream_model() -> None:
    m = parse_config({"models": [GOOD]}).models[0]
    assert (m.upstream, m.upstream_model, m.name) == (GOOD["upstream"], "llama", "llama-up")
    assert m.upstream_tokenizer == "auto"
    assert parse_config({"models": [{**GOOD, "upstream_tokenizer": "server"}]}).models[0].upstream_tokenizer == "server"


@pytest.mark.parametrize(("entry", "match"), [
    ({**GOOD, "upstream": "127.0.0.1:8000"}, "base URL"),
    ({k: v for k, v in GOOD.items() if k != "upstream_model"}, "upstream_model"),
    ({k: v for k, v in GOOD.items() if k != "name"}, "name"),
    ({**GOOD, "path": "/models/x"}, "leave path and layers out"),
    ({**GOOD, "layers": [0, 2]}, "leave path and layers out"),
    ({**GOOD, "upstream_timeout_s": 0}, "upstream_timeout_s"),
    ({**GOOD, "context_length": -1}, "context_length"),
    ({**GOOD, "upstream_tokenizer": "gguf"}, "upstream_tokenizer"),
])
def test_bad_upstream_entries_name_the_key(entry: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        parse_config({"models": [entry]}, "f.toml")
