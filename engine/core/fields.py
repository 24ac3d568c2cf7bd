"""Marshmallow fields that read JSON strictly, shared by every schema that loads requests."""

from __future__ import annotations

from typing import Any

from marshmallow import fields


class WholeNumber(fields.Integer):
    """A JSON integer: no strings, no 5.0 and no booleans (marshmallow 3 lets True through)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(strict=True, **kwargs)

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> int:
        if isinstance(value, bool):
            raise self.make_error("invalid")
        return super()._deserialize(value, attr, data, **kwargs)
