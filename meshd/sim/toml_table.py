"""Strict reading of TOML tables: every key is known, every value has the right type.

A ``Table`` wraps one TOML table and remembers which keys were read; ``done()`` raises
``ConfigError`` naming the first key nobody asked for, and the file. Type errors name the key
too. Nothing here knows what a scenario is; ``meshd.sim.scenario_parse`` says which keys exist.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from meshd.errors import ConfigError

_MISSING: Any = object()


class Table:
    """One TOML table being read; ``where`` is its dotted path, for messages."""

    def __init__(self, data: dict[str, Any], where: str, file: Path) -> None:
        if not isinstance(data, dict):
            raise ConfigError(f"{file}: '{where}' must be a table")
        self._data = data
        self._used: set[str] = set()
        self.where = where
        self.file = file

    def _key(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def error(self, key: str, message: str) -> ConfigError:
        return ConfigError(f"{self.file}: '{self._key(key)}' {message}")

    def has(self, key: str) -> bool:
        return key in self._data

    def raw(self, key: str, default: Any = _MISSING) -> Any:
        self._used.add(key)
        if key not in self._data:
            if default is _MISSING:
                raise ConfigError(f"{self.file}: missing key '{self._key(key)}'")
            return default
        return self._data[key]

    def text(self, key: str, default: Any = _MISSING) -> Any:
        v = self.raw(key, default)
        if v is not default and not isinstance(v, str):
            raise self.error(key, f"must be a string, not {type(v).__name__}")
        return v

    def number(self, key: str, default: Any = _MISSING, *, min_value: float | None = None) -> Any:
        v = self.raw(key, default)
        if v is default:
            return v
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise self.error(key, f"must be a number, not {type(v).__name__}")
        if min_value is not None and v < min_value:
            raise self.error(key, f"must be at least {min_value}, not {v}")
        return float(v)

    def integer(self, key: str, default: Any = _MISSING, *, min_value: int | None = None) -> Any:
        v = self.raw(key, default)
        if v is default:
            return v
        if isinstance(v, bool) or not isinstance(v, int):
            raise self.error(key, f"must be an integer, not {type(v).__name__}")
        if min_value is not None and v < min_value:
            raise self.error(key, f"must be at least {min_value}, not {v}")
        return v

    def flag(self, key: str, default: Any = _MISSING) -> Any:
        v = self.raw(key, default)
        if v is not default and not isinstance(v, bool):
            raise self.error(key, f"must be true or false, not {type(v).__name__}")
        return v

    def str_list(self, key: str, default: Any = _MISSING) -> Any:
        v = self.raw(key, default)
        if v is default:
            return v
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            raise self.error(key, "must be a list of strings")
        return tuple(v)

    def range(self, key: str, default: Any = _MISSING) -> Any:
        """A ``[low, high]`` pair of numbers with low <= high."""
        v = self.raw(key, default)
        if v is default:
            return v
        ok = isinstance(v, list) and len(v) == 2
        ok = ok and all(isinstance(x, int | float) and not isinstance(x, bool) for x in v)
        if not ok or v[0] > v[1] or v[0] < 0:
            raise self.error(key, "must be [low, high] with 0 <= low <= high")
        return (float(v[0]), float(v[1]))

    def table(self, key: str) -> Table:
        v = self.raw(key, {})
        return Table(v, self._key(key), self.file)

    def tables(self, key: str) -> list[Table]:
        """An array of tables (``[[key]]``); empty when absent."""
        v = self.raw(key, [])
        if not isinstance(v, list):
            raise self.error(key, "must be an array of tables ([[...]])")
        return [Table(x, f"{self._key(key)}[{i}]", self.file) for i, x in enumerate(v)]

    def all_keys(self) -> list[str]:
        """Every key, marking all as read (for free-form maps such as an RTT matrix)."""
        self._used.update(self._data)
        return sorted(self._data)

    def done(self) -> None:
        unknown = sorted(set(self._data) - self._used)
        if unknown:
            raise ConfigError(f"{self.file}: unknown key '{self._key(unknown[0])}'")


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``over`` on top of ``base``: tables merge key by key, anything else is replaced."""
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = v
    return out
