"""The checks every model's architecture block makes (``meshd.engine.arch.Arch``,
``meshd.embed.arch.BertArch``): built from the manifest's ``architecture`` object, figures that
must be positive integers, each error naming the field as the source spells it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol, TypeVar

from meshd.errors import ModelError


class Validated(Protocol):
    def validate(self, source: str, names: dict[str, str] | None = None) -> None: ...


A = TypeVar("A", bound=Validated)


def arch_from_json(cls: type[A], data: Any, source: str) -> A:
    """``cls(**data)``, validated; ``ModelError`` naming ``source`` for unknown or missing
    fields."""
    try:
        arch = cls(**data)
    except TypeError as err:
        raise ModelError(f"{source}: bad 'architecture' block ({err})") from None
    arch.validate(source)
    return arch


def check_positive_ints(arch: object, fields: Iterable[str], source: str,
                        names: Mapping[str, str]) -> None:
    """Each of ``fields`` is an integer >= 1 (not a bool); the error spells the field as in
    ``names`` (the source's spelling, e.g. Hugging Face's ``num_hidden_layers``)."""
    for name in fields:
        value = getattr(arch, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ModelError(f"{source}: {names.get(name, name)}={value!r} must be a positive integer")
