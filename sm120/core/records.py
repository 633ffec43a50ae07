"""A dataclass read back from the JSON data it was written as."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any


def field_values(
    cls: type[Any], data: Mapping[str, Any], value_of: Callable[[str, Any], Any]
) -> dict[str, Any]:
    """The keyword arguments of `cls` found in `data`, each passed through
    `value_of(name, value)`. Keys that are not fields are ignored: newer versions of sm120 may
    write them. Raises ValueError naming the first field that is missing and has no default."""
    values: dict[str, Any] = {}
    for field in dataclasses.fields(cls):
        if field.name not in data:
            if field.default is dataclasses.MISSING:
                raise ValueError(f"'{field.name}' is missing")
            continue
        values[field.name] = value_of(field.name, data[field.name])
    return values
