"""ConfigError, and the readers of one JSON number that name the bad field in it (every config
module checks its fields with these)."""

from __future__ import annotations

import math
from typing import Any


class ConfigError(ValueError):
    """A config.json field is missing, has the wrong type or contradicts another field."""


def number_field(value: Any, name: str, kind: type[int] | type[float] = float) -> Any:
    """`value` as a `kind` (int or float), or a ConfigError naming the field. Only JSON numbers pass
    (an int field takes only ints): a string or bool that happens to convert is a typo, not a
    setting, and `float("abc")` would fail with no field name."""
    accepted = int if kind is int else (int, float)
    if (isinstance(value, bool) or not isinstance(value, accepted)
            or (isinstance(value, float) and not math.isfinite(value))):
        raise ConfigError(f"config field `{name}` must be {'an integer' if kind is int else 'a number'}, got {value!r}")
    return kind(value)


def positive_field(value: Any, name: str, kind: type[int] | type[float] = float) -> Any:
    """`value` as a `kind` that is > 0, or a ConfigError naming the field."""
    number = number_field(value, name, kind)
    if number <= 0:
        raise ConfigError(f"config field `{name}` must be a positive {'integer' if kind is int else 'number'}, "
                          f"got {value!r}")
    return number
