"""[api] config: defaults, loopback-only open access, clear errors."""

from __future__ import annotations

from typing import Any

import pytest

from meshd.config import Config, parse_config, parse_listen
from meshd.errors import ConfigError


def test_defaults() -> None:
    api = Config().api
    assert (api.listen, api.auth, api.keys_file) == ("127.0.0.1:8080", "key", "api-keys")


@pytest.mark.parametrize("listen", ["127.0.0.1:0", "127.0.0.9:80", "[::1]:8080", "localhost:1"])
def test_open_access_is_allowed_on_loopback(listen: str) -> None:
    assert parse_config({"api": {"listen": listen, "auth": "none"}}).api.auth == "none"


@pytest.mark.parametrize("listen", ["0.0.0.0:8080", "10.0.0.5:8080", "[::]:8080", "example.com:80"])
def test_open_access_is_refused_off_loopback(listen: str) -> None:
    with pytest.raises(ConfigError, match='auth = "none" is allowed only on a loopback listener'):
        parse_config({"api": {"listen": listen, "auth": "none"}}, "f.toml")


@pytest.mark.parametrize(("api", "match"), [
    ({"listen": "8080"}, "HOST:PORT"),
    ({"listen": "::1:8080"}, "brackets"),
    ({"listen": "127.0.0.1:99999"}, "HOST:PORT"),
    ({"auth": "basic"}, '"key" or "none"'),
    ({"max_body_bytes": 10}, "max_body_bytes"),
    ({"port": 1}, "unknown key 'port'"),
])
def test_bad_values_name_the_key(api: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        parse_config({"api": api}, "f.toml")


def test_an_empty_listen_turns_the_api_off() -> None:
    assert parse_config({"api": {"listen": "", "auth": "none"}}).api.listen == ""


def test_parse_listen() -> None:
    assert parse_listen("[::1]:80") == ("::1", 80)
    assert parse_listen("0.0.0.0:8080") == ("0.0.0.0", 8080)
