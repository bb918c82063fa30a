"""The check settings records share: a value out of range is refused by name."""

from __future__ import annotations

import pytest


def assert_out_of_range(cls: type, field: str, value: object) -> None:
    """`cls(field=value)` raises ValueError naming `Cls.field=<value>` and its range."""
    with pytest.raises(ValueError, match=rf"{cls.__name__}\.{field}=.*out of range"):
        cls(**{field: value})
